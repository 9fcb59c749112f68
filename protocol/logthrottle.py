"""Rate-limited logging of per-message events (rejections, bans), so peers cannot flood our logs.

A key (e.g. (reason, peer)) gets one log record per `window_s`, and all keys together get at most
`total` per window; what is held back is counted, and the key's next record carries the count
(field `suppressed`). Per-round aggregates (node/peers/exchange.py) still count every event. Bounded
memory: the least recently seen key goes first beyond `max_keys` (its held-back count with it).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable, Hashable


class LogThrottle:
    def __init__(self, window_s: float = 60.0, total: int = 20, max_keys: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.total = total
        self.max_keys = max_keys
        self._clock = clock
        self._keys: OrderedDict[Hashable, list] = OrderedDict()  # key -> [last logged at, held back since]
        self._window_start = -float("inf")
        self._in_window = 0
        self.suppressed = 0  # held back in all, ever (tests, status)
        self._lock = threading.Lock()

    def allow(self, key: Hashable) -> int | None:
        """None: do not log this one (counted). Else log it, with this many held back before it."""
        now = self._clock()
        with self._lock:
            if now - self._window_start >= self.window_s:
                self._window_start, self._in_window = now, 0
            state = self._keys.get(key)
            if state is None:
                state = self._keys[key] = [-float("inf"), 0]
                if len(self._keys) > self.max_keys:
                    self._keys.popitem(last=False)
            else:
                self._keys.move_to_end(key)
            if now - state[0] < self.window_s or self._in_window >= self.total:
                state[1] += 1
                self.suppressed += 1
                return None
            held_back, state[0], state[1] = state[1], now, 0
            self._in_window += 1
            return held_back


def short_id(peer_id: str) -> str:
    """The last 8 characters of a peer id: what thread names and log lines show."""
    return str(peer_id)[-8:]
