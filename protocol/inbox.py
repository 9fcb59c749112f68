"""A bounded inbox that is fair between senders: when full, the heaviest sender loses.

A drop-oldest queue lets whoever out-sends the honest peers between two drains push their
messages out (a busy node lost 6,700-8,000 messages, honest and hostile alike). Here every item
is filed under its sender (the transport's origin id); when the inbox is full, one item of the
sender holding the MOST items is dropped (the arriving one if it is that sender's, else that
sender's oldest) and counted under that sender. A peer sending no faster than the others
therefore never loses a message to a flood.

    inbox = FairInbox(capacity=10_000)
    inbox.put(sender, item)                  # False if the item itself was the one dropped
    inbox.put(sender, item, ready_at=t)      # invisible to take() before t (simulated latency)
    inbox.take(max_items=None, now=t)        # ready items, in ready_at order (then arrival order)
    inbox.dropped                            # Counter: sender -> items dropped

Not thread-safe: a transport holds its own lock around it. Work per operation: O(log n).
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter, deque
from typing import Generic, TypeVar

T = TypeVar("T")


class FairInbox(Generic[T]):
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"FairInbox capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.dropped: Counter[str] = Counter()
        self._order = itertools.count()
        self._ready: list[tuple[float, int]] = []          # heap of (ready_at, order); lazily deleted
        self._items: dict[int, tuple[str, T]] = {}         # order -> (sender, item), live items only
        self._by_sender: dict[str, deque[int]] = {}        # sender -> orders, oldest first
        self._heaviest: list[tuple[int, int, str]] = []    # heap of (-count, order, sender); lazy

    def __len__(self) -> int:
        return len(self._items)

    def queued(self, sender: str) -> int:
        return len(self._by_sender.get(sender, ()))

    def put(self, sender: str, item: T, ready_at: float = 0.0) -> bool:
        """Files `item` under `sender`; when full, drops the heaviest sender's oldest item (which
        is this one if `sender` is, or ties for, the heaviest). False if `item` was dropped."""
        order = next(self._order)
        self._items[order] = (sender, item)
        heapq.heappush(self._ready, (ready_at, order))
        orders = self._by_sender.setdefault(sender, deque())
        orders.append(order)
        heapq.heappush(self._heaviest, (-len(orders), order, sender))
        if len(self._items) <= self.capacity:
            return True
        return self._drop_from_heaviest(sender) != order

    def _drop_from_heaviest(self, newest_sender: str) -> int:
        heaviest = self._heaviest
        while True:
            negative_count, _, sender = heaviest[0]
            orders = self._by_sender.get(sender)
            if orders is not None and len(orders) == -negative_count:
                break
            heapq.heappop(heaviest)  # stale entry: that sender's count changed since
        # The newest item goes when its sender is (one of) the heaviest: a flooder's own new
        # message, not its older queued ones; otherwise the heaviest sender's oldest.
        if len(self._by_sender[newest_sender]) == -negative_count:
            sender, victim = newest_sender, self._by_sender[newest_sender].pop()
        else:
            victim = self._by_sender[sender].popleft()
        self._forget_if_empty(sender)
        del self._items[victim]
        self.dropped[sender] += 1
        remaining = self._by_sender.get(sender)
        if remaining:
            heapq.heappush(heaviest, (-len(remaining), remaining[-1], sender))
        return victim

    def _forget_if_empty(self, sender: str) -> None:
        if not self._by_sender[sender]:
            del self._by_sender[sender]

    def take(self, max_items: int | None = None, now: float = math.inf) -> list[T]:
        """Removes and returns up to `max_items` (all if None) items ready by `now`, in order."""
        out: list[T] = []
        ready = self._ready
        while ready and ready[0][0] <= now and (max_items is None or len(out) < max_items):
            _, order = heapq.heappop(ready)
            entry = self._items.pop(order, None)
            if entry is None:
                continue  # dropped earlier
            sender, item = entry
            orders = self._by_sender[sender]
            orders.remove(order)  # usually the leftmost: O(1) in arrival order
            self._forget_if_empty(sender)
            if orders:
                heapq.heappush(self._heaviest, (-len(orders), orders[-1], sender))
            out.append(item)
        # lazily deleted heap entries must not pile up
        if len(self._ready) > 4 * self.capacity:
            self._ready = [entry for entry in self._ready if entry[1] in self._items]
            heapq.heapify(self._ready)
        if len(self._heaviest) > 4 * self.capacity:
            self._heaviest = [(-len(orders), orders[-1], sender) for sender, orders in self._by_sender.items()]
            heapq.heapify(self._heaviest)
        return out
