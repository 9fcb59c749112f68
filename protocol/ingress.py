"""The Ingress: the one door through which peer bytes become verified messages.

    ban check (origin, neighbour) -> rate limit at arrival time (neighbour, origin) -> size, decode,
    version, kind, kind-on-topic -> signature -> ban check (signing key) -> timestamp window
    -> replay window -> body decode -> schema limits

Cheap checks run first so that junk costs no crypto. Every rejection is counted by reason and
charged to the party it proves something about:
  * before the signature verifies: the transport's origin (`from_peer`: GossipSub's from_id, which
    the transport authenticates) that published the bytes; a message that merely CLAIMS a key must
    never hurt that key's owner, or anyone could get honest peers banned by forging.
  * after it: the signing key, except for the delivery faults (expired, replay, stale). Anyone
    can re-send a signed message, and GossipSub re-publishes a captured message under its original
    origin once its seen-cache forgot it, so neither the signer nor the origin is to blame. Nor is
    a relay that forwards before validating (every GossipSub router does). Delivery faults are
    therefore charged to nobody, unless `blame_neighbours` says the transport's neighbours
    validate what they forward: then the distinct neighbour that delivered it is charged.
  * rate-limit overflow is dropped and counted, never scored; only sustained flooding far above
    the limit (protocol/ratelimit.py) is.
`accept` never raises, whatever the bytes. Rejections are logged (protocol/logthrottle.py: one
record per reason and peer a minute, 20 a minute in all) at a level set by what they prove:
`rejection_level`.

What the Ingress cannot check (task known, reward recomputed) is node/'s job: it reports what it
finds through `report(peer, event)`, e.g. scoring.WRONG_REWARD.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Collection, Iterable

from google.protobuf.message import Message

from proto import swarm_pb2

from .envelope import decode_body, decode_envelope, verify_envelope
from .errors import Reason, Rejected
from .identity import peer_id_from_public_key
from .kinds import Kind
from .limits import Limits, validate_body
from .logthrottle import LogThrottle, short_id
from .ratelimit import RateLimiter, RateLimits, Verdict
from .replay import ReplayGuard
from .scoring import ACCEPTED, PeerScoreInfo, PeerScores, ScoreConfig
from .transports.base import Received

log = logging.getLogger(__name__)


DELIVERY_FAULTS = frozenset({Reason.REPLAY, Reason.STALE, Reason.EXPIRED})
NOBODYS_FAULT = frozenset({Reason.INTERNAL})
# A relay carries many origins' traffic: its connection gets this many times one origin's limits.
NEIGHBOUR_RATE_FACTOR = 8.0


def rejection_level(reason: Reason, weight: float) -> int:
    """Proof of misbehaviour (score weight -2 or worse: malformed, bad signature, oversized, schema)
    warns; a fault an honest peer can make (another version, clock skew, flooding) is info; what
    gossip does by itself (replays, stale or expired copies, rate limits, bans in force) and our
    own bugs (logged as such where they happen) are debug."""
    if reason in DELIVERY_FAULTS or weight >= 0:
        return logging.DEBUG
    return logging.WARNING if weight <= -2.0 else logging.INFO


class _NeighbourOverLimit(Rejected):
    """Over the limit of the connection that relayed it (not of the origin)."""


@dataclass(frozen=True, slots=True)
class Verified:
    """A message that passed every check."""

    sender: str            # libp2p peer id of the signing key (who wrote it)
    from_peer: str         # transport origin that published it (GossipSub from_id)
    kind: Kind
    envelope: swarm_pb2.Envelope
    body: Message          # RolloutGroup | Hint | HintRequest, validated against Limits
    received_at: float
    neighbour: str = ""    # connection that delivered it ("" where the transport cannot tell)


@dataclass(frozen=True)
class IngressSnapshot:
    accepted: int
    rejected_by_reason: dict[str, int]
    peers: list[PeerScoreInfo]


@dataclass(frozen=True)
class RejectionRecord:
    at: float
    from_peer: str
    reason: Reason
    detail: str


class Ingress:
    """Verifies peer bytes. Thread-safe; `accept` never raises."""

    def __init__(
        self,
        limits: Limits = Limits(),
        *,
        rate_limits: RateLimits = RateLimits(),
        neighbour_rate_limits: RateLimits | None = None,
        score_config: ScoreConfig = ScoreConfig(),
        replay_window: int = 1024,
        max_known_senders: int = 10_000,
        max_unknown_senders: int = 4_096,
        blame_neighbours: bool = False,
        clock: Callable[[], float] = time.time,
        rate_clock: Callable[[], float] | None = None,
    ) -> None:
        """`rate_clock`: the time rate limits run on (default `clock`); an in-process simulation
        passes its swarm time, or nodes sharing a CPU would look to each other like floods."""
        self.limits = limits
        self.blame_neighbours = blame_neighbours
        self._clock = clock
        rate_clock = rate_clock or clock
        self.rate_limiter = RateLimiter(rate_limits, rate_clock)
        self.neighbour_rate_limiter = RateLimiter(neighbour_rate_limits or rate_limits.scaled(NEIGHBOUR_RATE_FACTOR),
                                                  rate_clock)
        self.scores = PeerScores(score_config, clock)
        # A sender's window only needs keeping while its messages' timestamps could still pass.
        replay_ttl_s = limits.max_age_s + limits.max_clock_skew_s
        self.replay = ReplayGuard(replay_window, max_known=max_known_senders, max_unknown=max_unknown_senders,
                                  ttl_s=replay_ttl_s, clock=clock)
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.recent_rejections: deque[RejectionRecord] = deque(maxlen=100)
        self.log_throttle = LogThrottle()
        self._lock = threading.Lock()

    def accept(self, from_peer: str, data: bytes, received_at: float | None = None, *, neighbour: str = "",
               expected_kinds: Collection[Kind] | None = None) -> Verified | None:
        """The verified message, or None (counted by reason, charged to the responsible peer).

        from_peer: the transport's origin; neighbour: the connection that delivered the bytes ("" if
        unknown); received_at: arrival time (time.time()), for the rate limits; expected_kinds: the
        kinds that belong on the topic it came on (others are refused as wrong_topic)."""
        from_peer, neighbour = str(from_peer), str(neighbour)
        relayed_by = neighbour if neighbour and neighbour != from_peer else ""
        with self._lock:
            try:
                try:
                    envelope = self._authenticate(from_peer, relayed_by, data, received_at, expected_kinds)
                except Rejected as rejection:
                    return self._reject(from_peer, self._pre_auth_blame(from_peer, relayed_by, rejection), rejection)
                # From here on the signing key answers for the message.
                sender = peer_id_from_public_key(envelope.sender_public_key)
                try:
                    verified = self._admit(sender, from_peer, neighbour, envelope, received_at)
                except Rejected as rejection:
                    return self._reject(from_peer, self._post_auth_blame(sender, relayed_by, rejection), rejection)
            except Exception as exc:  # our bug: count it and keep the door working
                log.exception("ingress internal error on a message from %s", from_peer)
                return self._reject(from_peer, (), Rejected(Reason.INTERNAL, f"{type(exc).__name__}: {exc}"))
            self.accepted += 1
            self.scores.record(sender, ACCEPTED)
            self.replay.admit(envelope.sender_public_key)
            return verified

    def accept_received(self, item: Received, expected_kinds: Collection[Kind] | None = None) -> Verified | None:
        return self.accept(item.from_peer, item.data, item.received_at, neighbour=item.neighbour,
                           expected_kinds=expected_kinds)

    def accept_many(self, items: Iterable[Received], expected_kinds: Collection[Kind] | None = None) -> list[Verified]:
        return [verified for item in items if (verified := self.accept_received(item, expected_kinds)) is not None]

    def _pre_auth_blame(self, from_peer: str, relayed_by: str, rejection: Rejected) -> tuple[str, ...]:
        if isinstance(rejection, _NeighbourOverLimit):  # the relay's whole traffic, not one origin's
            return (relayed_by,) if self.blame_neighbours and rejection.reason is Reason.FLOODING else ()
        if rejection.reason in NOBODYS_FAULT:
            return ()
        if self.blame_neighbours and relayed_by:
            return from_peer, relayed_by
        return (from_peer,)

    def _post_auth_blame(self, sender: str, relayed_by: str, rejection: Rejected) -> tuple[str, ...]:
        if rejection.reason in NOBODYS_FAULT:
            return ()
        if rejection.reason in DELIVERY_FAULTS:
            return (relayed_by,) if self.blame_neighbours and relayed_by and relayed_by != sender else ()
        return (sender,)

    def _arrival(self, limiter: RateLimiter, received_at: float | None) -> float | None:
        """`received_at` on `limiter`'s clock: its now, less how long the message has waited."""
        if received_at is None:
            return None
        return limiter.now() - max(0.0, self._clock() - received_at)

    def _rate_limit(self, limiter: RateLimiter, key: str, nbytes: int, received_at: float | None,
                    error: type[Rejected] = Rejected) -> None:
        verdict = limiter.check(key, nbytes, self._arrival(limiter, received_at))
        if verdict is Verdict.DROP:
            raise error(Reason.RATE_LIMITED, f"{nbytes} bytes from {key}: over its rate limit")
        if verdict is Verdict.FLOOD:
            raise error(Reason.FLOODING, f"{nbytes} bytes from {key}: sustained far over its rate limit")

    def _authenticate(self, from_peer: str, relayed_by: str, data: bytes, received_at: float | None,
                      expected_kinds: Collection[Kind] | None) -> swarm_pb2.Envelope:
        """Checks that run before we know who wrote the message; returns a verified envelope."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise Rejected(Reason.MALFORMED, f"payload is a {type(data).__name__}, not bytes")
        for peer in (from_peer, relayed_by):
            if peer and self.scores.is_banned(peer):
                raise Rejected(Reason.BANNED, f"transport peer {peer} is banned")
        if relayed_by:
            self._rate_limit(self.neighbour_rate_limiter, relayed_by, len(data), received_at, _NeighbourOverLimit)
        self._rate_limit(self.rate_limiter, from_peer, len(data), received_at)
        envelope = decode_envelope(bytes(data), self.limits)
        if expected_kinds is not None and envelope.kind not in expected_kinds:
            raise Rejected(Reason.WRONG_TOPIC, f"a {Kind(envelope.kind).name} does not belong on this topic")
        verify_envelope(envelope)
        return envelope

    def _admit(self, sender: str, from_peer: str, neighbour: str, envelope: swarm_pb2.Envelope,
               received_at: float | None) -> Verified:
        """Checks on an authenticated envelope."""
        if self.scores.is_banned(sender):
            raise Rejected(Reason.BANNED, f"sender {sender} is banned")
        self._check_timestamp(envelope.timestamp_ms)
        # Replays (frequent in gossip) are refused before paying for the body decode.
        self.replay.check_and_record(envelope.sender_public_key, envelope.sequence, envelope.timestamp_ms)
        body = decode_body(envelope)
        kind = Kind(envelope.kind)
        validate_body(kind, body, self.limits)
        return Verified(sender, from_peer, kind, envelope, body, self._clock() if received_at is None else received_at,
                        neighbour)

    def _reject(self, from_peer: str, blamed: tuple[str, ...], rejection: Rejected) -> None:
        reason = rejection.reason
        self.rejected[reason] += 1
        self.recent_rejections.append(RejectionRecord(self._clock(), from_peer, reason, rejection.detail))
        for peer in blamed:
            self.scores.record(peer, reason)
        self._log_rejection(from_peer, blamed, rejection)
        return None

    def _log_rejection(self, from_peer: str, blamed: tuple[str, ...], rejection: Rejected) -> None:
        config = self.scores.config
        level = rejection_level(rejection.reason, config.weights.get(rejection.reason, config.unknown_event_weight))
        if not log.isEnabledFor(level):
            return
        held_back = self.log_throttle.allow((rejection.reason, from_peer))
        if held_back is not None:
            fields = {"event": "message_rejected", "stage": "ingress", "reason": str(rejection.reason),
                      "peer": short_id(from_peer), "peer_id": from_peer, "blamed": [short_id(p) for p in blamed],
                      "detail": rejection.detail, "suppressed": held_back}
            log.log(level, "rejected a message from %s: %s (%s)", short_id(from_peer), rejection.reason,
                    rejection.detail, extra=fields)

    def _check_timestamp(self, timestamp_ms: int) -> None:
        age_s = self._clock() - timestamp_ms / 1000.0
        if age_s > self.limits.max_age_s:
            raise Rejected(Reason.EXPIRED, f"timestamp is {age_s:.0f} s old > {self.limits.max_age_s} s")
        if -age_s > self.limits.max_clock_skew_s:
            raise Rejected(Reason.CLOCK_SKEW, f"timestamp is {-age_s:.0f} s in the future > {self.limits.max_clock_skew_s} s")

    def is_banned(self, peer: str) -> bool:
        """Whether `peer` (a transport origin or a signing key) serves a ban now."""
        with self._lock:
            return self.scores.is_banned(peer)

    def block(self, peers: Iterable[str]) -> None:
        """Bans `peers` until unblocked (an operator's decision, not a score): replaces the set."""
        with self._lock:
            self.scores.blocked = frozenset(peers)

    def report(self, peer: str, event: str, count: int = 1) -> None:
        """Evidence found after ingress (scoring.WRONG_REWARD, scoring.UNKNOWN_TASK, ...)."""
        with self._lock:
            self.scores.record(peer, event, count)

    def rejected_counts(self) -> dict[str, int]:
        """Rejections by reason so far (cheap: no peer records, unlike `snapshot`)."""
        with self._lock:
            return {str(r): n for r, n in self.rejected.items()}

    def snapshot(self) -> IngressSnapshot:
        with self._lock:
            return IngressSnapshot(self.accepted, {str(r): n for r, n in self.rejected.items()}, self.scores.snapshot())
