"""Counting and logging this node's refusals of peers' messages, for the ledger (node/peers/ledger.py).

Each refusal is counted (by reason, for `swarm-node status`) and logged as a `message_rejected`
record (stage "node"; the Ingress logs its own with stage "ingress"), rate-limited per reason and
peer (protocol/logthrottle.py) so a flood of bad messages cannot flood the log. Once a round,
`log_round` logs one `rejections` record with everything refused since the last one, the Ingress's
reasons and ours: the aggregate that nothing held back by the throttle escapes.
"""
from __future__ import annotations

import logging
import threading
from collections import Counter

from node.peers.reasons import HINTED, LEAK, MISMATCH, OUTBOUND_INVALID, OWN
from protocol.logthrottle import LogThrottle, short_id

log = logging.getLogger(__name__)

# Proof against the signer warns; what an honest peer with another model or task set can cause is
# info; our own echo and hinted groups are debug.
LOUD = frozenset({MISMATCH, LEAK})
QUIET = frozenset({OWN, HINTED})
NOT_A_PEER_MESSAGE = frozenset({OUTBOUND_INVALID})  # one of ours broke a limit: counted, not a rejection


def refusal_level(reason: str) -> int:
    if reason in LOUD:
        return logging.WARNING
    return logging.DEBUG if reason in QUIET else logging.INFO


class Refusals:
    """`counter` is the ledger's `rejected` Counter, guarded by its `lock`."""

    def __init__(self, counter: Counter, lock: threading.Lock):
        self.counter = counter
        self._lock = lock
        self.throttle = LogThrottle()
        self._logged: Counter[str] = Counter()  # totals at the last `log_round`

    def add(self, reason: str, sender: str, detail: str = "") -> None:
        with self._lock:
            self.counter[reason] += 1
        level = refusal_level(reason)
        if not log.isEnabledFor(level):
            return
        held_back = self.throttle.allow((reason, sender))
        if held_back is not None:
            fields = {"event": "message_rejected", "stage": "node", "reason": reason, "peer": short_id(sender),
                      "peer_id": sender, "detail": detail, "suppressed": held_back}
            log.log(level, "refused a message from %s: %s%s", short_id(sender), reason,
                    f" ({detail})" if detail else "", extra=fields)

    def log_round(self, round_index: int, ingress_rejected: dict[str, int]) -> None:
        """One info record of the peer messages rejected since the last call, if any were."""
        with self._lock:
            totals = Counter({k: n for k, n in self.counter.items() if k not in NOT_A_PEER_MESSAGE})
        totals.update(ingress_rejected)
        new = totals - self._logged
        self._logged = totals
        if not new:
            return
        by_reason = dict(sorted(new.items()))
        log.info("round %d: %d peer messages rejected (%s)", round_index, sum(new.values()),
                 ", ".join(f"{k}={n}" for k, n in by_reason.items()),
                 extra={"event": "rejections", "round": round_index, "total": sum(new.values()),
                        "by_reason": by_reason})
