"""A bounded buffer that is fair between senders: the one rule for every per-sender buffer.

Every transport's inbox (memory, libp2p, p2pd) and each lane of the ingest staging
(node/peers/ingest.py) is a FairBuffer; the verified-group pool (node/peers/pool.py) evicts by the same rule.
A drop-oldest queue lets whoever out-sends the honest peers between two drains push their messages
out (a busy node lost 6,700-8,000 messages, honest and hostile alike). Here every item is filed
under its sender (the transport's origin id), and:

  * quota: a sender already holding `per_sender` items makes room for its next one by losing its
    own oldest;
  * full: when the buffer holds more than `capacity` items (or more than `max_bytes` bytes), the
    HEAVIEST sender - the one holding the most items (bytes) - loses its oldest item; among equally
    heavy senders, the one whose oldest item arrived first. A sender that holds no more than the
    others therefore never loses a message to a flood. The oldest goes, whichever bound made room:
    the freshest rollouts are worth the most;
  * take: round-robin across senders (each sender's oldest first; the turn carries over from one
    call to the next; a new sender joins at the back), and the items taken come back oldest first,
    so taking everything is plain arrival order;
  * take_fresh: one turn that always yields when anything is fresh. Items past their use-by
    (`fresh(item)` false) met at the front of the sender's queue are removed, and the SAME turn takes
    that sender's next fresh item. Passing the turn on instead starved a slow-served sender: with N
    senders it got a turn every N takes, its backlog aged past the limit meanwhile, and every turn
    then met an expired item (an honest peer verified 0 times a minute beside 32 flooding keys).

    buffer = FairBuffer(capacity=10_000, per_sender=64)
    buffer.put(sender, item)    # the reasons of the drops it caused: [], [QUOTA] or [FULL, ...]
    buffer.take(max_items=None) # round-robin picks, oldest first
    buffer.take_fresh(fresh)    # (item or None, expired items removed on the way)
    buffer.dropped              # Counter: sender -> items dropped

Not thread-safe: its owner locks. Work: O(log senders) amortised per item put or dropped, and a
sort of what `take` picks.
"""
from __future__ import annotations

import heapq
import itertools
from collections import Counter, OrderedDict, deque
from operator import itemgetter
from typing import Callable, Generic, Iterable, Iterator, TypeVar

T = TypeVar("T")
QUOTA, FULL = "sender_quota", "full"  # why an item was dropped
_COMPACT_SLACK = 32  # stale heap entries tolerated beyond two per sender before a rebuild


class _Heaviest:
    """Senders by (load, oldest item first): a heap with lazy deletion, an entry being stale once
    its sender's load or oldest item changed; rebuilt from `queues` when stale entries pile up."""

    def __init__(self, queues: dict[str, deque], load: Callable[[str], int]) -> None:
        self.queues, self.load = queues, load
        self.heap: list[tuple[int, int, str]] = []  # (-load, oldest arrival, sender)

    def changed(self, sender: str) -> None:
        if len(self.heap) > 2 * len(self.queues) + _COMPACT_SLACK:
            self.heap = [(-self.load(s), q[0][0], s) for s, q in self.queues.items()]
            heapq.heapify(self.heap)
        else:
            heapq.heappush(self.heap, (-self.load(sender), self.queues[sender][0][0], sender))

    def top(self) -> str:
        heap = self.heap
        while True:
            negative_load, oldest, sender = heap[0]
            queue = self.queues.get(sender)
            if queue and queue[0][0] == oldest and self.load(sender) == -negative_load:
                return sender
            heapq.heappop(heap)


class FairBuffer(Generic[T]):
    """`capacity` items at most, `per_sender` (default: capacity) of one sender, and with `max_bytes`
    at most that many bytes as measured by `size(item)`. `arrivals`: a counter shared by buffers whose
    items move between them (the staging lanes), so their ages stay comparable."""

    def __init__(self, capacity: int, per_sender: int | None = None, *, max_bytes: int | None = None,
                 size: Callable[[T], int] | None = None, arrivals: Iterator[int] | None = None) -> None:
        per_sender = capacity if per_sender is None else per_sender
        if capacity < 1 or per_sender < 1 or (max_bytes is not None and max_bytes < 1):
            raise ValueError(f"a FairBuffer needs capacity, per_sender and max_bytes >= 1, got {capacity}, "
                             f"{per_sender} and {max_bytes}")
        if (max_bytes is None) != (size is None):
            raise ValueError("a FairBuffer's max_bytes needs size (an item's bytes), and size needs max_bytes")
        self.capacity, self.per_sender, self.max_bytes, self.size = capacity, per_sender, max_bytes, size
        self.dropped: Counter[str] = Counter()
        self._arrivals = arrivals if arrivals is not None else itertools.count()
        self._queues: OrderedDict[str, deque[tuple[int, T]]] = OrderedDict()  # in turn order
        self._count = 0
        self._bytes: Counter[str] = Counter()
        self._total_bytes = 0
        self._by_items = _Heaviest(self._queues, lambda sender: len(self._queues[sender]))
        self._by_bytes = _Heaviest(self._queues, self._bytes.__getitem__) if max_bytes is not None else None

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        return self._total_bytes

    def queued(self, sender: str) -> int:
        return len(self._queues.get(sender, ()))

    def put(self, sender: str, item: T) -> list[str]:
        """Files `item` under `sender`, then applies the quota and the bounds. Returns the reason of
        each drop that made room (QUOTA or FULL); the dropped item may be this one."""
        self._append(sender, [(next(self._arrivals), item)])
        reasons = []
        if len(self._queues[sender]) > self.per_sender:
            self._drop_oldest(sender)
            reasons.append(QUOTA)
        while self._count > self.capacity:
            self.evict()
            reasons.append(FULL)
        while self.max_bytes is not None and self._total_bytes > self.max_bytes:
            self.evict(by_bytes=True)
            reasons.append(FULL)
        return reasons

    def heaviest(self, by_bytes: bool = False) -> tuple[str, int] | None:
        """The sender that `evict(by_bytes)` would take from, and how many items (bytes) it holds
        (None when empty)."""
        if not self._queues:
            return None
        sender = self._heap(by_bytes).top()
        return sender, self._bytes[sender] if by_bytes else len(self._queues[sender])

    def evict(self, by_bytes: bool = False) -> tuple[str, T]:
        """Drops (and counts) the oldest item of the sender holding the most items (bytes); returns
        its sender and the item."""
        sender = self._heap(by_bytes).top()
        return sender, self._drop_oldest(sender)

    def _heap(self, by_bytes: bool) -> _Heaviest:
        if by_bytes and self._by_bytes is None:
            raise ValueError("a FairBuffer without max_bytes does not measure bytes")
        return self._by_bytes if by_bytes else self._by_items

    def take(self, max_items: int | None = None) -> list[T]:
        """Removes up to `max_items` (all if None) items picked round-robin across senders, and
        returns them oldest first."""
        if max_items is None or max_items >= self._count:
            picked = [entry for queue in self._queues.values() for entry in queue]
            self._clear()
        else:
            picked = [self._take_turn() for _ in range(max(0, max_items))]
        picked.sort(key=itemgetter(0))
        return [item for _, item in picked]

    def take_fresh(self, fresh: Callable[[T], bool]) -> tuple[T | None, int]:
        """The oldest fresh item of the sender whose turn it is, after removing (uncounted in
        `dropped`: the caller counts them) the items of that sender that are no longer fresh; a
        sender left with nothing fresh passes the turn on. Returns (item or None, items removed)."""
        expired = 0
        while self._queues:
            sender = next(iter(self._queues))
            self._queues.move_to_end(sender)  # to the back of the line
            while sender in self._queues:
                _, item = self._pop_oldest(sender)
                if fresh(item):
                    return item, expired
                expired += 1
        return None, expired

    def _clear(self) -> None:
        self._queues.clear()
        self._bytes.clear()
        self._count = self._total_bytes = 0
        self._by_items.heap.clear()
        if self._by_bytes is not None:
            self._by_bytes.heap.clear()

    def _take_turn(self) -> tuple[int, T]:
        sender = next(iter(self._queues))
        self._queues.move_to_end(sender)  # to the back of the line
        return self._pop_oldest(sender)

    def detach(self, sender: str) -> list[tuple[int, T]]:
        """Removes every item of `sender`, uncounted, as (arrival, item) pairs for `attach`."""
        queue = self._queues.pop(sender, None)
        if not queue:
            return []
        self._count -= len(queue)
        self._total_bytes -= self._bytes.pop(sender, 0)
        return list(queue)

    def attach(self, sender: str, entries: Iterable[tuple[int, T]]) -> None:
        """Files what `detach` returned (from this buffer or one sharing `arrivals`) under `sender`,
        oldest first; the bounds are the caller's to apply (`evict`)."""
        self._append(sender, sorted(entries, key=itemgetter(0)))

    def _append(self, sender: str, entries: list[tuple[int, T]]) -> None:
        queue = self._queues.setdefault(sender, deque())
        queue.extend(entries)
        self._count += len(entries)
        if self.max_bytes is not None:
            nbytes = sum(self.size(item) for _, item in entries)
            self._bytes[sender] += nbytes
            self._total_bytes += nbytes
        self._changed(sender)

    def _drop_oldest(self, sender: str) -> T:
        self.dropped[sender] += 1
        return self._pop_oldest(sender)[1]

    def _pop_oldest(self, sender: str) -> tuple[int, T]:
        queue = self._queues[sender]
        entry = queue.popleft()
        self._count -= 1
        if self.max_bytes is not None:
            nbytes = self.size(entry[1])
            self._bytes[sender] -= nbytes
            self._total_bytes -= nbytes
        if queue:
            self._changed(sender)
        else:
            del self._queues[sender]
            self._bytes.pop(sender, None)
        return entry

    def _changed(self, sender: str) -> None:
        self._by_items.changed(sender)
        if self._by_bytes is not None:
            self._by_bytes.changed(sender)


def heaviest_first(items: Iterable[tuple[str, T]], n: int) -> list[T]:
    """The `n` items (of `items`, (sender, item) pairs oldest first) that the rule drops one by one:
    each time the sender holding the most loses its oldest. For bounded collections that cannot be a
    FairBuffer themselves (node/peers/pool.py's pool, which removes groups anywhere when they are used)."""
    items = list(items)
    buffer: FairBuffer[T] = FairBuffer(max(1, len(items)))
    for sender, item in items:
        buffer.put(sender, item)
    return [buffer.evict()[1] for _ in range(min(n, len(items)))]
