"""The bench: a key whose picked or audited group failed verification sits out for a while.

Blamed or not, a failed group cost this node a verification and its slot. Without a bench, a key
whose groups fail for reasons that blame nobody (`untokenizable`, `too_long`, a scorer timeout...)
kept its turn: the young slot went to the same senior key again and again, and an honest newcomer
seen later was used 0 times in 40 rounds. So a failure benches the key for `rounds` of our rounds
(and, with a clock, `seconds` as well: both must pass) and sends it to the back of the young line
(`order`). Within one `sample` call the key is benched at once, so its other groups are skipped.

Unverifiable results (UNVERIFIABLE) never touch a key's ban score (an honest peer with another
tokenizer or a slow answer causes them), but they are counted per key: once a key has `strikes` of
them since its last verified group, each further one doubles its bench (capped at MAX_DOUBLINGS), so
a repeat offender sits out for long while an honest peer's rare failure costs it a few rounds. A
verified group halves the count. Bounded: at most `max_keys` records, the least recently failed
forgotten first. Saved with each checkpoint (`state_dict`): a restart does not free a repeat
offender. Not thread-safe: its pool's owner serialises access.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from node.peers.reasons import GROUP_TOO_LONG, REFUSED, TIMEOUT, TOO_LONG, UNTOKENIZABLE

UNVERIFIABLE = frozenset({TIMEOUT, REFUSED, TOO_LONG, UNTOKENIZABLE, GROUP_TOO_LONG})
MAX_DOUBLINGS = 6  # a repeat offender's bench grows to 64 times the base at most
MAX_BENCH_KEYS = 4096


@dataclass
class _Record:
    until_round: int = 0
    until_s: float = 0.0
    strikes: int = 0  # unverifiable results since its last verified group (halved by each)
    failed_at: int = 0  # order of its latest failure: later failures queue further back


class Bench:
    def __init__(self, rounds: int, seconds: float, strikes: int, clock: Callable[[], float] | None = None,
                 max_keys: int = MAX_BENCH_KEYS):
        self.rounds, self.seconds, self.strikes = max(1, rounds), seconds, strikes
        self.clock = clock  # None: rounds only
        self.max_keys = max_keys
        self._records: OrderedDict[str, _Record] = OrderedDict()  # least recently failed first
        self._failures = itertools.count(1)
        self.benchings = 0  # failures that benched a key, ever (for status)

    def fail(self, origin: str, reason: str, round_index: int) -> None:
        """A picked or audited group of `origin` failed with `reason` during round `round_index`."""
        record = self._records.pop(origin, None) or _Record()
        self._records[origin] = record
        if reason in UNVERIFIABLE:
            record.strikes += 1
        factor = 2 ** min(MAX_DOUBLINGS, max(0, record.strikes - self.strikes))
        record.until_round = max(record.until_round, round_index + self.rounds * factor)
        if self.clock is not None:
            record.until_s = max(record.until_s, self.clock() + self.seconds * factor)
        record.failed_at = next(self._failures)
        self.benchings += 1
        while len(self._records) > self.max_keys:
            self._records.popitem(last=False)

    def passed(self, origin: str) -> None:
        """A group of `origin` was verified: its count of unverifiable results halves."""
        record = self._records.get(origin)
        if record is not None:
            record.strikes //= 2

    def benched(self, origin: str, round_index: int) -> bool:
        record = self._records.get(origin)
        if record is None:
            return False
        return round_index < record.until_round or (self.clock is not None and self.clock() < record.until_s)

    def order(self, origin: str) -> int:
        """Sort key among keys waiting for a slot: never failed (0) first, then by latest failure."""
        record = self._records.get(origin)
        return 0 if record is None else record.failed_at

    def strikes_of(self, origin: str) -> int:
        record = self._records.get(origin)
        return 0 if record is None else record.strikes

    def benched_now(self, round_index: int) -> list[str]:
        return [key for key in self._records if self.benched(key, round_index)]

    def state_dict(self) -> list[list]:
        """[[key, until_round, until_s, strikes, failed_at], ...], least recently failed first (JSON-able)."""
        return [[key, r.until_round, r.until_s, r.strikes, r.failed_at] for key, r in self._records.items()]

    def load_state_dict(self, rows: list[list]) -> None:
        """Replaces the records with what `state_dict` saved; raises ValueError (nothing changed) on
        anything else."""
        try:
            records = OrderedDict((str(key), _Record(int(until_round), float(until_s), int(strikes), int(failed_at)))
                                  for key, until_round, until_s, strikes, failed_at in rows[-self.max_keys:])
        except (TypeError, ValueError) as err:
            raise ValueError(f"not a bench state: {err!r}") from err
        self._records = records
        self._failures = itertools.count(1 + max((r.failed_at for r in records.values()), default=0))
