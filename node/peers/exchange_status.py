"""What `swarm-node status` shows of a node's exchange (node/peers/exchange.py): counters, recent rounds,
admission, ingest and the exchange's costs. Only ever waits for a few dict copies under the
exchange's lock, never for ingest."""
from __future__ import annotations

from collections import Counter

from node.peers.reasons import OUTBOUND_INVALID
from policy.types import TIERS

# the exchange's work the compute clock charges (node/testnet/clock.py), counted since the last collect
EXCHANGE_WORK = ("messages_checked", "groups_verified", "messages_published", "messages_skimmed")

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


def round_row(ex, received: int, flat: int, audited: int, chosen: list, tiers: Counter, reasons: Counter,
              round_index: int, seconds: dict[str, float]) -> dict:
        """What the round's metrics row gets from the exchange (node/train/loop.py adds it)."""
        return {
            "external_received": received,
            "external_used": len(chosen),
            "external_samples_used": sum(len(g.correct) for g in chosen),  # their share correct: the next / this
            "external_correct_used": sum(sum(g.correct) for g in chosen),
            "external_zero_variance": flat,
            "groups_audited": audited,
            "groups_verified_unused": max(0, ex._work["groups_verified"] - len(chosen)),
            "external_used_by_sender": dict(Counter(g.origin for g in chosen)),
            "external_tiers": {str(t): tiers.get(str(t), 0) for t in TIERS},
            "external_tier_reasons": dict(reasons),
            "external_staleness_rounds": [round_index - g.meta["sender_round"] for g in chosen],
            "pool_size": len(ex.pool),
            "t_verify": round(ex.verify_budget.spent, 6),  # the training thread's verification seconds
            "verify_budget_exhausted": ex.verify_budget.deferred,  # picks and audits left for the budget
            "groups_verified_ahead": ex._work["groups_verified_ahead"],  # by the ingest worker, since the last collect
            "keys_benched": len(ex.pool.bench.benched_now(round_index)),
            "hint_requests_waiting": len(ex._requests),
            "peers_connected": len(ex.transport.peers()),
            **ex._shared,
            **{key: float(ex._work[key]) for key in EXCHANGE_WORK},
            **{f"t_exchange_{phase}": value for phase, value in seconds.items()},
        }
