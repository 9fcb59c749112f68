"""The Ingress: the one door through which peer bytes become verified messages.

    ban check (transport peer) -> rate limit -> size, decode, version, kind -> signature
    -> ban check (signing key) -> timestamp window -> replay/dedup -> body decode -> schema limits

Cheap checks run first so that junk costs no crypto. Every rejection is counted by reason and
charged to the party it proves something about: failures before the signature verifies are
charged to the transport peer that delivered the bytes (a message that merely CLAIMS a key must
never hurt that key's owner, or anyone could get honest peers banned by forging); failures after
it are charged to the signing key. `accept` never raises, whatever the bytes.

What the Ingress cannot check (task known, reward recomputed) is node/'s job: it reports what it
finds through `report(peer, event)`, e.g. scoring.WRONG_REWARD.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Iterable

from google.protobuf.message import Message

from proto import swarm_pb2

from .envelope import decode_body, decode_envelope, verify_envelope
from .errors import Reason, Rejected
from .identity import peer_id_from_public_key
from .kinds import Kind
from .limits import Limits, validate_body
from .ratelimit import RateLimiter, RateLimits
from .replay import ReplayGuard
from .scoring import ACCEPTED, PeerScoreInfo, PeerScores, ScoreConfig
from .transport import Received

log = logging.getLogger(__name__)


DELIVERY_FAULTS = frozenset({Reason.REPLAY, Reason.STALE, Reason.EXPIRED})


@dataclass(frozen=True, slots=True)
class Verified:
    """A message that passed every check."""

    sender: str            # libp2p peer id of the signing key (who wrote it)
    from_peer: str         # transport peer that delivered it (may be a gossip relay)
    kind: Kind
    envelope: swarm_pb2.Envelope
    body: Message          # RolloutGroup | Hint | HintRequest, validated against Limits
    received_at: float


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
        score_config: ScoreConfig = ScoreConfig(),
        replay_window: int = 1024,
        max_senders: int = 10_000,
        seen_capacity: int = 65_536,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limits = limits
        self._clock = clock
        self.rate_limiter = RateLimiter(rate_limits, clock)
        self.scores = PeerScores(score_config, clock)
        # A message id only needs remembering while its timestamp could still pass the window.
        seen_ttl_s = limits.max_age_s + limits.max_clock_skew_s
        self.replay = ReplayGuard(replay_window, max_senders, seen_capacity, seen_ttl_s, clock)
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.recent_rejections: deque[RejectionRecord] = deque(maxlen=100)
        self._lock = threading.Lock()

    def accept(self, from_peer: str, data: bytes, received_at: float | None = None) -> Verified | None:
        """The verified message, or None (counted by reason, charged to the responsible peer)."""
        from_peer = str(from_peer)
        with self._lock:
            try:
                try:
                    envelope = self._authenticate(from_peer, data)
                except Rejected as rejection:
                    return self._reject(from_peer, from_peer, rejection)
                # From here on the signing key answers for the message.
                sender = peer_id_from_public_key(envelope.sender_public_key)
                try:
                    verified = self._admit(sender, from_peer, envelope, received_at)
                except Rejected as rejection:
                    # Anyone can re-send a signed message: replays and expired copies are the
                    # fault of the peer that delivered them, never of the (possibly honest) signer,
                    # or replaying a victim's messages would get the victim banned.
                    blamed = from_peer if rejection.reason in DELIVERY_FAULTS else sender
                    return self._reject(from_peer, blamed, rejection)
            except Exception as exc:  # our bug: count it and keep the door working
                log.exception("ingress internal error on a message from %s", from_peer)
                return self._reject(from_peer, None, Rejected(Reason.INTERNAL, f"{type(exc).__name__}: {exc}"))
            self.accepted += 1
            self.scores.record(sender, ACCEPTED)
            return verified

    def accept_received(self, item: Received) -> Verified | None:
        return self.accept(item.from_peer, item.data, item.received_at)

    def accept_many(self, items: Iterable[Received]) -> list[Verified]:
        return [verified for item in items if (verified := self.accept_received(item)) is not None]

    def _authenticate(self, from_peer: str, data: bytes) -> swarm_pb2.Envelope:
        """Checks that run before we know who wrote the message; returns a verified envelope."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise Rejected(Reason.MALFORMED, f"payload is a {type(data).__name__}, not bytes")
        if self.scores.is_banned(from_peer):
            raise Rejected(Reason.BANNED, f"transport peer {from_peer} is banned")
        if not self.rate_limiter.allow(from_peer, len(data)):
            raise Rejected(Reason.RATE_LIMITED, f"{len(data)} bytes from {from_peer}")
        envelope = decode_envelope(bytes(data), self.limits)
        verify_envelope(envelope)
        return envelope

    def _admit(self, sender: str, from_peer: str, envelope: swarm_pb2.Envelope, received_at: float | None) -> Verified:
        """Checks on an authenticated envelope; every failure is the sender's."""
        if self.scores.is_banned(sender):
            raise Rejected(Reason.BANNED, f"sender {sender} is banned")
        self._check_timestamp(envelope.timestamp_ms)
        # Replays (frequent in gossip) are refused before paying for the body decode.
        self.replay.check_and_record(envelope.sender_public_key, envelope.sequence)
        body = decode_body(envelope)
        kind = Kind(envelope.kind)
        validate_body(kind, body, self.limits)
        return Verified(sender, from_peer, kind, envelope, body, self._clock() if received_at is None else received_at)

    def _reject(self, from_peer: str, blamed: str | None, rejection: Rejected) -> None:
        reason = rejection.reason
        self.rejected[reason] += 1
        self.recent_rejections.append(RejectionRecord(self._clock(), from_peer, reason, rejection.detail))
        if blamed is not None:
            self.scores.record(blamed, reason)
        log.debug("rejected message from %s: %s (%s)", from_peer, reason, rejection.detail)
        return None

    def _check_timestamp(self, timestamp_ms: int) -> None:
        age_s = self._clock() - timestamp_ms / 1000.0
        if age_s > self.limits.max_age_s:
            raise Rejected(Reason.EXPIRED, f"timestamp is {age_s:.0f} s old > {self.limits.max_age_s} s")
        if -age_s > self.limits.max_clock_skew_s:
            raise Rejected(Reason.CLOCK_SKEW, f"timestamp is {-age_s:.0f} s in the future > {self.limits.max_clock_skew_s} s")

    def report(self, peer: str, event: str, count: int = 1) -> None:
        """Evidence found after ingress (scoring.WRONG_REWARD, scoring.UNKNOWN_TASK, ...)."""
        with self._lock:
            self.scores.record(peer, event, count)

    def snapshot(self) -> IngressSnapshot:
        with self._lock:
            return IngressSnapshot(self.accepted, {str(r): n for r, n in self.rejected.items()}, self.scores.snapshot())
