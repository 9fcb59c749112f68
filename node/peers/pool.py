"""The bounded pool of verified peer groups, and the samplers that pick the J external groups.

Bounds: age, total size, and groups per sender (a flooding peer evicts only its own). A group ages
from its verification, not its arrival: a node that verifies a busy peer's backlog late must still
get to sample what it verified (aged from arrival, a paced node's honest peer had every group
verified at the age limit and evicted before any sampling: trained in 0 of 120 rounds). It goes
after `max_age_rounds` of our rounds (its behaviour log-probs grow stale as we train) or, with a
clock, `max_age_s` seconds, whichever comes first.
Over the size bound, young keys' groups go first, and within young or established keys the rule of
every bounded per-sender buffer (protocol/inbox.py): the sender holding the most groups loses its
oldest. Oldest-first would be safe enough here (every pooled group passed the Ingress, staging's
quotas and verification, and no sender holds more than max_per_sender), but it still lets a few
busy established senders age out a quiet one's groups; heaviest-first costs one pass over the
pool in a round where it is over its bound.
Samplers (swarm.sampling_policy):
    uniform     uniform over the pool's groups, as in the SAPO paper
    per_sender  senders in random order, one group each, repeat: fair across senders (default)
    weak_tasks  informed: weighted by how badly this node does on the group's task family
                (1 - its pass-rate posterior mean), with each sender held to its fair share
A group is trained on once: sampling removes it from the pool.

Verified when picked: the exchange pools a peer's group once it passed the cheap checks
(node/peers/verify.py `Candidate`: signed, a task we know, within limits; its rewards still the sender's
claims) and passes `sample` / `take_matching` its verification stage (node/peers/verification.py,
a `PickVerifier`), which runs the expensive checks on the picked groups only (unless the ingest
worker verified them ahead: `next_unverified`). A group that fails is gone (the stage's ledger
counts and blames) and its key is benched (node/peers/bench.py: it
sits out a while, skipped at once within this call, and goes to the back of the young line); its
slot is picked again, at most `MAX_REPICKS` times a call. When the verifier says the training thread's
verification budget is spent (it returns None), the group stays pooled and the rest of the call
picks only groups already verified. A group whose verified rewards turn out flat is not trained (an
established key's) or only credited (a young key's, as below). Without a verifier (a bare pool of
verified groups, as the tests build) what is pooled is trained as it is.

Admission (node/peers/admission.py; on for a node, off for a bare GroupPool): a group whose content is
already pooled or was credited recently is refused whoever signed it, and keys that have not
yet earned weight ("young") hold at most `young_share_max` of the sampled mix. Young keys'
zero-variance groups are pooled too: a young slot that picks one credits the key without training.
"""
from __future__ import annotations

import math
import random
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Callable, Literal, Protocol

from node.peers.admission import Admission
from node.peers.bench import Bench
from node.train.groups import ScoredGroup
from node.peers.reasons import DUPLICATE
from protocol.inbox import heaviest_first

SamplingPolicy = Literal["uniform", "per_sender", "weak_tasks"]
MIN_WEIGHT = 0.05  # weak_tasks: a family we already master still gets an occasional look
MAX_REPICKS = 3  # sampling again for slots whose picks failed verification, at most this often a call


class PickVerifier(Protocol):
    """A picked group (a Candidate, or a ScoredGroup already verified) -> verified, or the reason it
    was refused (counted by the verifier), or None: not verified now (the training thread's
    verification budget is spent), left pooled."""

    def verify_pick(self, group) -> ScoredGroup | str | None: ...


@dataclass
class PoolEntry:
    group: ScoredGroup  # or a node/peers/verify.py Candidate: the same task / origin / flat / texts, unverified
    verified_round: int  # the round during which it was verified: it ages from there
    verified_at: float = 0.0  # the pool's clock then (0 without a clock)
    digest: str = field(default="", compare=False)  # set by GroupPool.add when admission is on


class GroupPool:
    def __init__(self, max_groups: int, max_age_rounds: int, max_per_sender: int,
                 admission: Admission | None = None, rejected: Counter | None = None, *,
                 max_age_s: float = float("inf"), clock: Callable[[], float] | None = None,
                 bench_rounds: int = 4, bench_seconds: float = 30.0, bench_strikes: int = 3):
        self.max_groups = max_groups
        self.max_age_rounds = max_age_rounds
        self.max_age_s = max_age_s
        self.clock = clock  # None: ages in rounds only
        self.max_per_sender = max_per_sender
        self.admission = admission  # None: a plain bounded pool (no dedup, no young-key share)
        self.rejected = rejected if rejected is not None else Counter()  # reasons for refused groups
        self.entries: deque[PoolEntry] = deque()
        self._per_sender: Counter[str] = Counter()  # pooled groups per sender (add checks its cap in O(1))
        self.bench = Bench(bench_rounds, bench_seconds, bench_strikes, clock)  # keys whose groups failed
        self.round = 0  # the round being collected (evict starts it)
        self.verifying: set[int] = set()  # ids of candidates the ingest worker is verifying ahead now

    @classmethod
    def from_config(cls, pool, admission=None, rejected: Counter | None = None,
                    clock: Callable[[], float] | None = None, trusted: frozenset[str] = frozenset()) -> GroupPool:
        """A pool from the config's `swarm.pool` section (its keys are this constructor's parameters),
        admission on with a `swarm.admission` section (node/peers/admission.py); with `clock` (wall
        seconds) the windows in time apply too; `trusted`: the keys the operator named."""
        gate = None if admission is None else Admission.from_config(admission, clock, trusted)
        return cls(**pool.model_dump(), admission=gate, rejected=rejected, clock=clock)

    def now(self) -> float:
        """The pool's clock (0.0 without one): what a new entry's `verified_at` should be."""
        return 0.0 if self.clock is None else self.clock()

    def __len__(self) -> int:
        return len(self.entries)

    def held_by(self, origin: str) -> int:
        """How many of `origin`'s groups are pooled now."""
        return self._per_sender.get(origin, 0)

    def add(self, entry: PoolEntry) -> bool:
        """Adds `entry`; returns True when the sender's oldest group had to go to make room. A group
        whose content is already pooled or was used is refused (counted as `duplicate_content`)."""
        if self.admission is not None:
            entry.digest = self.admission.digest(entry.group)
            if not self.admission.admit(entry.group.origin, entry.digest, entry.verified_round):
                self.rejected[DUPLICATE] += 1  # no blame: honest peers can produce the same group
                return False
        origin = entry.group.origin
        evicted = self._per_sender[origin] >= self.max_per_sender
        if evicted:
            self._remove(next(e for e in self.entries if e.group.origin == origin))  # no peer holds more than its share
        self.entries.append(entry)
        self._per_sender[origin] += 1
        return evicted

    def drop_sender(self, origin: str) -> int:
        """Removes every pooled group of `origin` (a key the operator banned); returns how many."""
        mine = [e for e in self.entries if e.group.origin == origin]
        for entry in mine:
            self._remove(entry)
        return len(mine)

    def replace_unverified(self, candidate, group: ScoredGroup) -> None:
        """`candidate`, if still pooled, is now its verified `group` (an audit or the worker passed it)."""
        self.bench.passed(group.origin)
        for entry in self.entries:
            if entry.group is candidate:
                entry.group = group
                return

    def failed(self, origin: str, reason: str, candidate=None) -> None:
        """A group of `origin` failed verification outside a pick (an audit, a verification ahead):
        `candidate`, if pooled, leaves the pool, and the key is benched."""
        for entry in self.entries:
            if candidate is not None and entry.group is candidate:
                self._remove(entry)
                break
        self.bench.fail(origin, reason, self.round)

    def verified_count(self, young: bool | None = None) -> int:
        """Pooled groups already verified (ahead of the picks, or by an audit), of young keys or not."""
        return sum(isinstance(e.group, ScoredGroup) and young in (None, self._young(e)) for e in self.entries)

    def next_unverified(self, most_verified: int):
        """The pooled group most worth verifying ahead of the picks (not yet verified, its key not
        benched): established keys' while fewer than `most_verified` of theirs wait verified, then
        young keys' in the order the young slots take them while fewer than their share of it does
        (young slots are few: their verified groups must not wait in numbers); None when there is none."""
        waiting = [e for e in self.entries if not isinstance(e.group, ScoredGroup)
                   and not self.bench.benched(e.group.origin, self.round)]
        established = [e for e in waiting if not self._young(e)]
        if established and self.verified_count(young=False) < most_verified:
            return established[-1].group  # the newest: the samplers leave the pool's oldest to age out
        share = 1.0 if self.admission is None else self.admission.young_share_max
        if self.verified_count(young=True) >= max(1, math.ceil(share * most_verified)):
            return None
        young = [e for e in waiting if self._young(e)]
        young = self._young_turns(young, 1) if self.admission is not None else young[-1:]
        return young[0].group if young else None

    def evict(self, round_index: int) -> None:
        """Drops groups too old or over the size bound; also starts round `round_index` for admission."""
        now = self.now()
        self.round = round_index
        while self.entries and (round_index - self.entries[0].verified_round > self.max_age_rounds
                                or (self.clock is not None and now - self.entries[0].verified_at > self.max_age_s)):
            self._remove(self.entries[0])
        if self.admission is not None:
            self.admission.start_round(round_index)
        excess = len(self.entries) - self.max_groups
        for young in (True, False):  # young keys' first: fresh keys cannot push out earned ones
            if excess > 0:
                kept = [(e.group.origin, e) for e in self.entries if self._young(e) == young]
                for entry in heaviest_first(kept, excess):
                    self._remove(entry)
                    excess -= 1

    def take_matching(self, prompt_keys: set[str], verifier: PickVerifier | None = None) -> list[ScoredGroup]:
        """Cross-actor: the newest pooled group for each of `prompt_keys` that `verifier` passes,
        removed from the pool. Only established keys' groups: young keys reach the mix through
        `sample`'s share alone. Flat groups count here: merged with ours they can carry signal."""
        taken: list[ScoredGroup] = []
        left: set[int] = set()  # ids of entries the verifier left unverified: the budget is spent
        for _ in range(1 + MAX_REPICKS):
            newest: dict[str, PoolEntry] = {}
            for entry in self.entries:
                if (entry.group.task.prompt_key in prompt_keys and not self._young(entry)
                        and self._usable(entry, left)):
                    newest[entry.group.task.prompt_key] = entry
            good, failed = self._verified(list(newest.values()), verifier, left)
            taken += self._use(good)
            prompt_keys = prompt_keys - {e.group.task.prompt_key for e in good}
            if not failed:
                break
        return taken

    def sample(self, k: int, policy: SamplingPolicy, rng: random.Random,
               weakness: Callable[[ScoredGroup], float] | None = None,
               verifier: PickVerifier | None = None) -> list[ScoredGroup]:
        """Up to k groups with reward variance, removed from the pool (flat groups stay: they are
        only useful merged into one of our groups), each passed by `verifier` (module doc). Young keys'
        groups hold at most their share of the mix (Admission.split), in seniority order with keys
        whose groups failed at the back (node/peers/bench.py); a young key's flat group picked there
        is credited to it (node/peers/admission.py), not trained, and leaves its slot to established
        keys. The sampling policy picks the established ones. Benched keys' groups are not picked."""
        chosen: list[ScoredGroup] = []
        left: set[int] = set()  # ids of entries the verifier left unverified: from then on, verified ones only
        for _ in range(1 + MAX_REPICKS):
            picked = self._pick(k - len(chosen), policy, rng, weakness, left)
            good, failed = self._verified(picked, verifier, left)
            self._consume([e for e in good if e.group.flat])  # a young key's: credited, not trained
            chosen += self._use([e for e in good if not e.group.flat])
            if not failed or len(chosen) >= k:
                break
        return chosen

    def _usable(self, entry: PoolEntry, left: set[int]) -> bool:
        """Whether a pick may take `entry` now: its key not benched, and, once the verification
        budget is spent (`left` holds what it left unverified), only a group already verified."""
        if self.bench.benched(entry.group.origin, self.round) or id(entry.group) in self.verifying:
            return False  # a group being verified ahead is not verified a second time by a pick
        return not left or (isinstance(entry.group, ScoredGroup) and id(entry) not in left)

    def _verified(self, picked: list[PoolEntry], verifier: PickVerifier | None,
                  left: set[int]) -> tuple[list[PoolEntry], int]:
        """The picked entries `verifier` passes (their group replaced by the verified one; an
        established key's group that turns out flat is dropped, uncredited), and how many failed
        (each benching its key) or were left unverified (their ids added to `left`)."""
        if verifier is None:
            return picked, 0
        good, failed = [], 0
        for entry in picked:
            group = verifier.verify_pick(entry.group)
            if group is None:  # the budget is spent: it stays pooled, and its slot goes to a verified group
                left.add(id(entry))
                failed += 1
            elif isinstance(group, str):
                failed += 1
                self._remove(entry)
                self.bench.fail(entry.group.origin, group, self.round)
            elif group.flat and not entry.group.flat and not self._young(entry):
                self._remove(entry)  # claimed variance our verifier does not see (another verifier's)
            else:
                self.bench.passed(entry.group.origin)
                entry.group = group
                good.append(entry)
        return good, failed

    def _pick(self, k: int, policy: SamplingPolicy, rng: random.Random,
              weakness: Callable[[ScoredGroup], float] | None, left: set[int]) -> list[PoolEntry]:
        """Up to k entries as `sample` describes (young flat ones included), still pooled."""
        usable = [e for e in self.entries if self._usable(e, left)]
        eligible = [e for e in usable if not e.group.flat]
        chosen: list[PoolEntry] = []
        established = [e for e in eligible if not self._young(e)]
        n = min(k, len(established))
        if self.admission is not None:
            young = [e for e in usable if self._young(e)]  # flat ones too: picking one credits its key
            slots, _ = self.admission.split(k, len(young), len(established))
            chosen = self._young_turns(young, slots)
            self.admission.took_turn(list(dict.fromkeys(e.group.origin for e in chosen)))
            self.admission.spend(len(chosen))
            n = min(k - sum(not e.group.flat for e in chosen), len(established))
        if policy == "uniform":
            chosen += rng.sample(established, n)
        elif policy == "per_sender":
            chosen += _round_robin(established, n, rng)
        elif policy == "weak_tasks":
            chosen += _weighted_fair(established, n, rng, weakness or (lambda g: 0.5))
        else:
            raise ValueError(f"unknown sampling policy {policy!r}: valid are uniform, per_sender, weak_tasks")
        return chosen

    def wants_flat(self, origin: str) -> bool:
        """Whether a zero-variance group of `origin` is worth pooling outside cross-actor
        composition: only a young key's, which can earn credit with it."""
        return self.admission is not None and self.admission.is_young(origin)

    def _young(self, entry: PoolEntry) -> bool:
        return self.admission is not None and self.admission.is_young(entry.group.origin)

    def _young_turns(self, young: list[PoolEntry], slots: int) -> list[PoolEntry]:
        """Up to `slots` young groups, one per key: keys whose groups never failed first, then by
        latest failure (node/peers/bench.py), each in Admission.young_order (keys still earning
        credits first, then one key per network group in turn); then again. 200 keys from one
        network group take that group's turn, not the young slots, and a key whose pick failed goes
        behind every key that did not fail since."""
        by_key: dict[str, list[PoolEntry]] = defaultdict(list)
        for entry in young:
            by_key[entry.group.origin].append(entry)
        for entries in by_key.values():  # popped from the end: its newest trainable group first
            entries.sort(key=lambda e: (not e.group.flat, e.verified_round))
        order = sorted(self.admission.young_order(list(by_key)), key=self.bench.order)  # stable: turns kept
        chosen: list[PoolEntry] = []
        while len(chosen) < slots and order:
            for key in list(order):
                if len(chosen) == slots:
                    break
                chosen.append(by_key[key].pop())  # its newest group
                if not by_key[key]:
                    order.remove(key)
        return chosen

    def _use(self, chosen: list[PoolEntry]) -> list[ScoredGroup]:
        self._consume(chosen)
        return [e.group for e in chosen]

    def _consume(self, entries: list[PoolEntry]) -> None:
        """Out of the pool, credited to their keys and remembered (node/peers/admission.py)."""
        for entry in entries:
            self._remove(entry)
            if self.admission is not None:
                self.admission.credit(entry.group.origin, entry.digest)

    def _remove(self, entry: PoolEntry) -> None:
        self.entries.remove(entry)
        self._per_sender[entry.group.origin] -= 1
        if self._per_sender[entry.group.origin] <= 0:
            del self._per_sender[entry.group.origin]
        if self.admission is not None:
            self.admission.unpooled(entry.group.origin, entry.digest)


def _round_robin(entries: list[PoolEntry], k: int, rng: random.Random) -> list[PoolEntry]:
    by_sender: dict[str, list[PoolEntry]] = defaultdict(list)
    for entry in entries:
        by_sender[entry.group.origin].append(entry)
    chosen: list[PoolEntry] = []
    while len(chosen) < k:
        senders = sorted(by_sender)
        rng.shuffle(senders)
        for sender in senders[: k - len(chosen)]:
            mine = by_sender[sender]
            chosen.append(mine.pop(rng.randrange(len(mine))))
            if not mine:
                del by_sender[sender]
    return chosen


def _weighted_fair(entries: list[PoolEntry], k: int, rng: random.Random,
                   weakness: Callable[[ScoredGroup], float]) -> list[PoolEntry]:
    """Weighted sampling without replacement (Efraimidis-Spirakis keys u^(1/w)), each sender capped
    at ceil(k / senders) so that weighting cannot hand the mix to one peer; slots left by senders
    with fewer groups than their share go to the next keys."""
    senders = {e.group.origin for e in entries}
    quota = math.ceil(k / max(1, len(senders)))
    keyed = sorted(entries, key=lambda e: rng.random() ** (1.0 / max(MIN_WEIGHT, weakness(e.group))), reverse=True)
    taken: dict[str, int] = defaultdict(int)
    chosen = []
    for entry in keyed:
        if len(chosen) < k and taken[entry.group.origin] < quota:
            taken[entry.group.origin] += 1
            chosen.append(entry)
    leftover = [e for e in keyed if e not in chosen]  # senders with few groups left slots unused
    return chosen + leftover[: k - len(chosen)]
