"""Peer reputation: a score per peer that events move, that decays toward 0, and temporary bans.

Events are plain strings: "accepted", every rejection Reason, and evidence that only node/ can
see ("wrong_reward": claimed reward disagrees with the locally recomputed one; "unknown_task";
"task_not_configured": a task family or seed the receiver does not configure, which cancels the
message's "accepted" and no more, as an honest peer with another task mix sends it;
"hint_leaks_answer": a hint that contains the task's answer).
A score below `ban_threshold` bans the peer for `ban_base_s * 2^(bans so far)` (capped), resets
its score to 0 and, after the ban, lets it earn its way back. Scores decay exponentially toward
0 (half-life `half_life_s`), so old sins and old merit both fade; positive scores are capped so
a peer cannot bank credit and then misbehave for free.

Bounded memory: at most `max_peers` records; the least recently touched unbanned peer goes
first, so flooding us with fresh identities cannot evict an existing ban.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Mapping

from .errors import Reason
from .logthrottle import LogThrottle, short_id

log = logging.getLogger(__name__)

ACCEPTED = "accepted"
WRONG_REWARD = "wrong_reward"
UNKNOWN_TASK = "unknown_task"
UNCONFIGURED_TASK = "task_not_configured"
HINT_LEAK = "hint_leaks_answer"
_ACCEPTED_WEIGHT = 0.1

DEFAULT_WEIGHTS: Mapping[str, float] = {
    ACCEPTED: _ACCEPTED_WEIGHT,
    WRONG_REWARD: -2.0,
    UNKNOWN_TASK: -0.2,     # a family we configure, named wrongly (digest, index, a held-out question)
    # a family or seed we do not configure: nothing net, so an honest peer with a dataset we lack is
    # never banned for it (at -0.2 it was, in 1-4 minutes) nor earns credit with it
    UNCONFIGURED_TASK: -_ACCEPTED_WEIGHT,
    HINT_LEAK: -2.0,        # a hint that gives the answer away: poisoned, or a careless writer
    # pre-authentication: charged to the transport peer
    Reason.RATE_LIMITED: 0.0,   # dropped, not misbehaviour: an honest peer may briefly out-send us
    Reason.FLOODING: -0.5,      # sustained above 4x the rate limit (protocol/ratelimit.py)
    Reason.WRONG_TOPIC: -0.5,   # whoever published it on that topic chose the topic
    Reason.OVERSIZED: -5.0,
    Reason.MALFORMED: -3.0,
    Reason.VERSION: -0.5,   # an honest peer running another protocol version
    Reason.UNKNOWN_KIND: -0.5,
    Reason.BAD_SIGNATURE: -5.0,
    # post-authentication: charged to the signing key. expired / replay / stale are delivery
    # faults: never the signer's; only a neighbour that validates what it forwards is charged
    # (protocol/ingress.py)
    Reason.CLOCK_SKEW: -0.5,
    Reason.EXPIRED: -0.2,
    Reason.REPLAY: -0.5,    # gossip can legitimately deliver a duplicate now and then
    Reason.STALE: -0.2,
    Reason.SCHEMA: -3.0,
    Reason.NONFINITE_LOGPROB: -3.0,
    Reason.POSITIVE_LOGPROB: -3.0,
    Reason.TOO_MANY_COMPLETIONS: -3.0,
    Reason.TOO_MANY_TOKENS: -3.0,
    Reason.TEXT_TOO_LONG: -3.0,
    Reason.FLOAT_RANGE: -3.0,
    Reason.BAD_OFFSETS: -3.0,
    Reason.LENGTH_MISMATCH: -3.0,
    Reason.BANNED: 0.0,     # already paying for it
    Reason.INTERNAL: 0.0,   # our bug, not theirs
}


@dataclass(frozen=True)
class ScoreConfig:
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    unknown_event_weight: float = -1.0
    half_life_s: float = 600.0
    max_score: float = 10.0
    ban_threshold: float = -10.0
    ban_base_s: float = 60.0
    ban_max_s: float = 24 * 3600.0
    max_peers: int = 10_000


@dataclass(frozen=True)
class PeerScoreInfo:
    """One peer's standing (field names match swarm.v1.PeerInfo)."""

    peer_id: str
    score: float
    banned: bool
    ban_remaining_s: float
    ban_count: int
    accepted: int
    rejected: int


class _Record:
    __slots__ = ("score", "updated", "banned_until", "ban_count", "accepted", "rejected")

    def __init__(self, now: float) -> None:
        self.score = 0.0
        self.updated = now
        self.banned_until = 0.0
        self.ban_count = 0
        self.accepted = 0
        self.rejected = 0


class PeerScores:
    """Not thread-safe on its own (the Ingress locks around it)."""

    def __init__(self, config: ScoreConfig = ScoreConfig(), clock: Callable[[], float] = time.monotonic) -> None:
        self.blocked: frozenset[str] = frozenset()  # banned by the operator until unblocked (Ingress.block)
        self.config = config
        self._clock = clock
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._ban_log = LogThrottle(window_s=60.0, total=20)  # a peer is banned once per ban; fresh keys are free

    def __len__(self) -> int:
        return len(self._records)

    def _decayed(self, record: _Record, now: float) -> None:
        elapsed = now - record.updated
        if elapsed > 0:
            record.score *= 0.5 ** (elapsed / self.config.half_life_s)
            record.updated = now

    def record(self, peer: str, event: str, count: int = 1) -> None:
        """Applies `event`'s weight (`count` times) to `peer`; may start a ban."""
        config = self.config
        now = self._clock()
        record = self._records.get(peer)
        if record is None:
            record = self._records[peer] = _Record(now)
            self._evict_if_full()
        else:
            self._records.move_to_end(peer)
            self._decayed(record, now)
        if event == ACCEPTED:
            record.accepted += count
        else:
            record.rejected += count
        if record.banned_until > now:
            return  # no score changes while banned: the ban is the penalty
        weight = config.weights.get(event, config.unknown_event_weight)
        record.score = min(config.max_score, record.score + weight * count)
        if record.score < config.ban_threshold:
            duration = min(config.ban_max_s, config.ban_base_s * 2.0**record.ban_count)
            record.banned_until = now + duration
            record.ban_count += 1
            record.score = 0.0
            self._log_ban(peer, event, duration, record.ban_count)

    def _log_ban(self, peer: str, event: str, duration: float, ban_count: int) -> None:
        held_back = self._ban_log.allow(peer)
        if held_back is not None:
            log.warning("banned %s for %.0f s (ban %d; last event %s)", short_id(peer), duration, ban_count, event,
                        extra={"event": "peer_banned", "peer": short_id(peer), "peer_id": peer, "ban_s": duration,
                               "ban_count": ban_count, "cause": str(event), "suppressed": held_back})

    def _evict_if_full(self) -> None:
        if len(self._records) <= self.config.max_peers:
            return
        now = self._clock()
        records = self._records
        for _ in range(len(records)):  # oldest first; a banned peer moves to the back and stays
            peer, record = next(iter(records.items()))
            if record.banned_until <= now:
                del records[peer]
                return
            records.move_to_end(peer)
        # everyone is banned: drop the ban that ends first
        del records[min(records, key=lambda p: records[p].banned_until)]

    def score(self, peer: str) -> float:
        record = self._records.get(peer)
        if record is None:
            return 0.0
        self._decayed(record, self._clock())
        return record.score

    def is_banned(self, peer: str) -> bool:
        if peer in self.blocked:
            return True
        record = self._records.get(peer)
        return record is not None and record.banned_until > self._clock()

    def ban_remaining_s(self, peer: str) -> float:
        record = self._records.get(peer)
        return 0.0 if record is None else max(0.0, record.banned_until - self._clock())

    def snapshot(self) -> list[PeerScoreInfo]:
        """Every tracked peer, lowest score first."""
        now = self._clock()
        infos = []
        for peer, record in self._records.items():
            self._decayed(record, now)
            remaining = max(0.0, record.banned_until - now)
            infos.append(
                PeerScoreInfo(peer, record.score, remaining > 0, remaining, record.ban_count, record.accepted, record.rejected)
            )
        return sorted(infos, key=lambda info: info.score)
