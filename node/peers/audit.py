"""The audit stage of the inbound path (node/peers/exchange.py), and the memory it draws from.

`Audit.run`: each round a latest unverified group of `swarm.audit_per_round` random senders is
verified all the same (node/peers/verification.py), so a liar is caught even if the mix never picks
its groups. `Unaudited` is what it draws from: each sender's latest groups that nobody verified,
whatever they are (a prechecked `Candidate`, a zero-variance claim, or skimmed bytes). Bounded:
AUDIT_KEPT per sender, MAX_AUDIT_SENDERS senders (the least recently heard from forgotten first)
and AUDIT_MAX_BYTES in all, as `size(group)` measures them: past it the sender holding the most
bytes loses its oldest (the rule of protocol/inbox.py), so a sender of big messages
pays for them. Counts alone let 4 x 1024 skimmed messages of up to 1 MiB each be held: about 4 GiB.
The audit re-verifies a group, so it keeps the group, not a digest of it. Not thread-safe: the
stages use it under the ledger's lock (node/peers/ledger.py)."""
from __future__ import annotations

import random
from collections import Counter, OrderedDict, deque
from typing import TYPE_CHECKING, Callable, Generic, TypeVar

from node.peers.verify import Candidate, Refusal
from protocol import Kind
from protocol.transports.base import Received

if TYPE_CHECKING:  # the stages it is handed (verification.py imports this module)
    from node.peers.gate import Gate
    from node.peers.pool import GroupPool
    from node.peers.verification import Verification

AUDIT_KEPT = 4  # a sender's latest unverified groups the audit draws from
MAX_AUDIT_SENDERS = 1024  # senders whose unverified groups are kept for the audit (the oldest forgotten)
AUDIT_MAX_BYTES = 32 * 1024 * 1024  # what they may hold in all

G = TypeVar("G")


class Unaudited(Generic[G]):
    """sender -> its latest groups not verified yet (module doc). `size(group)`: its bytes."""

    def __init__(self, size: Callable[[G], int], kept: int = AUDIT_KEPT, max_senders: int = MAX_AUDIT_SENDERS,
                 max_bytes: int = AUDIT_MAX_BYTES):
        if max_bytes < 1:
            raise ValueError(f"the audit memory needs max_bytes >= 1, got {max_bytes}")
        self.size, self.kept, self.max_senders, self.max_bytes = size, kept, max_senders, max_bytes
        self._by_sender: OrderedDict[str, deque[tuple[G, int]]] = OrderedDict()  # (group, its bytes)
        self._bytes: Counter[str] = Counter()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._by_sender)

    def remember(self, sender: str, group: G) -> None:
        """One of the sender's latest groups not verified yet: not only the latest is kept, or a
        sender whose latest is always an honest group the mix picks would never be audited."""
        kept = self._by_sender.setdefault(sender, deque())
        kept.append((group, self.size(group)))
        self._add(sender, kept[-1][1])
        if len(kept) > self.kept:
            self._take(sender, 0)
        self._by_sender.move_to_end(sender)
        while len(self._by_sender) > self.max_senders:
            self._forget_sender(next(iter(self._by_sender)))
        while self.nbytes > self.max_bytes:
            self._take(max(self._bytes, key=self._bytes.__getitem__), 0)  # the heaviest sender's oldest

    def forget(self, sender: str, group: G) -> None:
        """`group` (by identity) is being verified now: nothing left to audit there."""
        kept = self._by_sender.get(sender)
        for index, (held, _) in enumerate(kept or ()):
            if held is group:
                self._take(sender, index)
                return

    def draw(self, rng: random.Random, senders: int) -> list[tuple[str, G]]:
        """One group each of `senders` senders chosen at random (fewer if fewer are held), each
        removed from what is held."""
        chosen = rng.sample(sorted(self._by_sender), min(senders, len(self._by_sender)))
        return [(sender, self._take(sender, rng.randrange(len(self._by_sender[sender])))) for sender in chosen]

    def _add(self, sender: str, nbytes: int) -> None:
        self._bytes[sender] += nbytes
        self.nbytes += nbytes

    def _forget_sender(self, sender: str) -> None:
        del self._by_sender[sender]
        self.nbytes -= self._bytes.pop(sender, 0)

    def _take(self, sender: str, index: int) -> G:
        kept = self._by_sender[sender]
        group, nbytes = kept[index]
        del kept[index]
        self._add(sender, -nbytes)
        if not kept:
            self._forget_sender(sender)
        return group


def audit_size(group) -> int:
    """The bytes the audit memory holds for `group`: a skimmed message's raw bytes, or the size of a
    checked candidate's or a claim's message."""
    if hasattr(group, "data"):  # skimmed: protocol Received
        return len(group.data)
    return getattr(group, "msg", group).ByteSize()  # a Candidate's message, or a RolloutGroup


class Audit:
    """Stage: the round's RNG -> how many unverified groups were verified (module doc), within the
    training thread's verification budget. One that passes stays verified in the pool; one that
    fails leaves it and benches its key (a benched liar is still audited, and banned by its score).
    Skimmed bytes meet the Ingress first (`gate`); a zero-variance claim, never prechecked, both
    stages of verification."""

    def __init__(self, unaudited: Unaudited, gate: Gate, verification: Verification, pool: GroupPool,
                 peer_id: str, per_round: int):
        self.unaudited, self.gate, self.verification, self.pool = unaudited, gate, verification, pool
        self.peer_id, self.per_round = peer_id, per_round

    def run(self, rng: random.Random) -> int:
        audited = 0
        budget = self.verification.budget
        for sender, group in self.unaudited.draw(rng, self.per_round):
            if isinstance(group, Received):  # skimmed: the Ingress first
                verified = self.gate.accept(group, {Kind.ROLLOUT_GROUP})
                if verified is None or verified.sender == self.peer_id:
                    continue
                sender, group = verified.sender, verified.body
            if isinstance(group, Candidate):
                verdict = budget.run(lambda left: self.verification.verify_candidate(group, left))
            else:  # a zero-variance claim, never prechecked: both stages now
                verdict = budget.run(lambda left: self.verification.verify_group(sender, group, left))
            if verdict is None:
                continue
            audited += 1
            if isinstance(verdict, Refusal):
                self.pool.failed(sender, verdict.reason, group)
            elif isinstance(group, Candidate):
                self.pool.replace_unverified(group, verdict)
        return audited
