"""What the exchange's audit draws from (node/peers/exchange.py `_audit`): each sender's latest groups
that nobody verified, whatever they are (a prechecked `Candidate`, a zero-variance claim, or skimmed
bytes). Bounded: AUDIT_KEPT per sender, MAX_AUDIT_SENDERS senders (the least recently heard from
forgotten first). Not thread-safe: the exchange uses it under its lock."""
from __future__ import annotations

import random
from collections import OrderedDict, deque
from typing import Generic, TypeVar

AUDIT_KEPT = 4  # a sender's latest unverified groups the audit draws from
MAX_AUDIT_SENDERS = 1024  # senders whose unverified groups are kept for the audit (the oldest forgotten)

G = TypeVar("G")


class Unaudited(Generic[G]):
    """sender -> its latest groups not verified yet (module doc)."""

    def __init__(self, kept: int = AUDIT_KEPT, max_senders: int = MAX_AUDIT_SENDERS):
        self.kept, self.max_senders = kept, max_senders
        self._by_sender: OrderedDict[str, deque[G]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_sender)

    def remember(self, sender: str, group: G) -> None:
        """One of the sender's latest groups not verified yet: not only the latest is kept, or a
        sender whose latest is always an honest group the mix picks would never be audited."""
        self._by_sender.setdefault(sender, deque(maxlen=self.kept)).append(group)
        self._by_sender.move_to_end(sender)
        while len(self._by_sender) > self.max_senders:
            self._by_sender.popitem(last=False)

    def forget(self, sender: str, group: G) -> None:
        """`group` (by identity) is being verified now: nothing left to audit there."""
        kept = self._by_sender.get(sender)
        for index, held in enumerate(kept or ()):
            if held is group:
                self._take(sender, index)
                return

    def draw(self, rng: random.Random, senders: int) -> list[tuple[str, G]]:
        """One group each of `senders` senders chosen at random (fewer if fewer are held), each
        removed from what is held."""
        chosen = rng.sample(sorted(self._by_sender), min(senders, len(self._by_sender)))
        return [(sender, self._take(sender, rng.randrange(len(self._by_sender[sender])))) for sender in chosen]

    def _take(self, sender: str, index: int) -> G:
        kept = self._by_sender[sender]
        group = kept[index]
        del kept[index]
        if not kept:
            del self._by_sender[sender]
        return group
