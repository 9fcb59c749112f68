"""What `swarm-node status` shows of a node's exchange (node/peers/exchange.py): counters, recent rounds,
admission, ingest and the exchange's costs. Only ever waits for a few dict copies under the
exchange's lock, never for ingest."""
from __future__ import annotations

from node.peers.reasons import OUTBOUND_INVALID

MAX_KEYS_SHOWN = 64  # the most recently established keys listed
MAX_KEY_RECORDS = 256  # key records listed (`swarm-node peers`): established first, then the most credited


def exchange_status(ex) -> dict:
    """Counters and recent rounds; only ever waits for a few dict copies, never for ingest.
    `accepted` counts messages that passed every check, the Ingress's and this node's (a group
    the Ingress let through and we then refused is not accepted); `ingress_accepted` the former."""
    with ex._lock:  # node-level refusals first: each belongs to a message the snapshot below counts
        refused = sum(n for reason, n in ex.rejected.items() if reason != OUTBOUND_INVALID)
    snap = ex.ingress.snapshot()
    ingest = {"mode": ex.ingest_mode}
    if ex._worker is not None:
        ingest.update(ex._worker.snapshot(), alive=ex._worker.alive)
    if ex.sandbox is not None:
        ingest["scorer_sandbox"] = ex.sandbox.snapshot()
    admission = admission_status(ex)
    transport = {"transport": {**ex.transport.stats(), **ex.outbox.counters}, "connected": ex.transport.peers(),
                 "listen_addrs": ex.transport.listen_addrs()}
    with ex._lock:
        return {
            "peer_id": ex.peer_id,
            "swarm": ex.options.swarm,
            "accepted": max(0, snap.accepted - refused),
            "ingress_accepted": snap.accepted,
            "rejected_by_reason": {**snap.rejected_by_reason, **ex.rejected},
            "peers": snap.peers,
            **transport,
            "rounds": list(ex.history),
            "used_by_sender": dict(ex.used_by_sender),
            "tiers_used": dict(ex.tiers_used),
            "observed": dict(ex.observed),
            "ingest": ingest,
            "admission": admission,
            "hint_requests": {"waiting": len(ex._requests), **ex._requests.dropped},
            "audit_memory": {"senders": len(ex._unaudited), "bytes": ex._unaudited.nbytes},
            "exchange_totals": {key: round(value, 6) for key, value in ex.totals.items()},
        }


def admission_status(ex) -> dict:
    """Keys established (with when, unix time; 0 in round-only mode) and how many are young."""
    with ex._lock:
        admission = ex.pool.admission
        established = admission.established()
        banned = ex.decisions.banned
        records = [{"key": key, "established": est, "network_group": r.group, "credited": r.credited,
                    "first_seen_s": r.first_seen_s, "established_at": r.established_at,
                    "last_credited_s": r.last_credited_s, "operator_banned": key in banned}
                   for key, r, est in admission.records(MAX_KEY_RECORDS)]
        records += [{"key": key, "operator_banned": True} for key in banned if key not in admission.keys]
        return {"established": [[key, at] for key, at in established[-MAX_KEYS_SHOWN:]],
                "established_count": len(established), "young_count": len(admission.keys) - len(established),
                "keys": records}
