"""What `swarm-node status` shows of a node's exchange (node/peers/exchange.py): counters, recent rounds,
admission, ingest and the exchange's costs, read from the facade's public stages. Only ever waits
for a few dict copies under the ledger's lock (node/peers/ledger.py), never for ingest. `RoundBook`
keeps what each collect adds: the round's row (`round_row`), recent rounds and totals."""
from __future__ import annotations

from collections import Counter, deque

from node.peers.ledger import EXCHANGE_PHASES, EXCHANGE_WORK
from node.peers.reasons import OUTBOUND_INVALID
from policy.types import TIERS

# what `status` sums over every round: the work, groups received / used / audited / verified unused,
# and each phase's seconds
TOTALED = (*EXCHANGE_WORK, "external_received", "external_used", "groups_audited", "groups_verified_unused",
           *(f"t_exchange_{phase}" for phase in EXCHANGE_PHASES))

MAX_KEYS_SHOWN = 64  # the most recently established keys listed
MAX_KEY_RECORDS = 256  # key records listed (`swarm-node peers`): established first, then the most credited


def exchange_status(ex) -> dict:
    """Counters and recent rounds; only ever waits for a few dict copies, never for ingest.
    `accepted` counts messages that passed every check, the Ingress's and this node's (a group
    the Ingress let through and we then refused is not accepted); `ingress_accepted` the former."""
    ledger = ex.ledger
    with ledger.lock:  # node-level refusals first: each belongs to a message the snapshot below counts
        refused = sum(n for reason, n in ledger.rejected.items() if reason != OUTBOUND_INVALID)
    snap = ex.ingress.snapshot()
    ingest = {"mode": ex.ingest_mode}
    if ex.worker is not None:
        ingest.update(ex.worker.snapshot(), alive=ex.worker.alive)
    if ex.sandbox is not None:
        ingest["scorer_sandbox"] = ex.sandbox.snapshot()
    admission = admission_status(ex)
    transport = {"transport": {**ex.transport.stats(), **ex.outbox.counters}, "connected": ex.transport.peers(),
                 "listen_addrs": ex.transport.listen_addrs()}
    rounds, requests, unaudited = ex.rounds, ex.hint_traffic.requests, ex.unaudited
    with ledger.lock:
        return {
            "peer_id": ex.peer_id,
            "swarm": ex.options.swarm,
            "accepted": max(0, snap.accepted - refused),
            "ingress_accepted": snap.accepted,
            "rejected_by_reason": {**snap.rejected_by_reason, **ledger.rejected},
            "peers": snap.peers,
            **transport,
            "rounds": list(rounds.history),
            "used_by_sender": dict(rounds.used_by_sender),
            "tiers_used": dict(rounds.tiers_used),
            "observed": dict(ledger.observed),
            "ingest": ingest,
            "admission": admission,
            "hint_requests": {"waiting": len(requests), **requests.dropped},
            "audit_memory": {"senders": len(unaudited), "bytes": unaudited.nbytes},
            "exchange_totals": {key: round(value, 6) for key, value in rounds.totals.items()},
        }


def admission_status(ex) -> dict:
    """Keys established (with when, unix time; 0 in round-only mode) and how many are young."""
    with ex.ledger.lock:
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


class RoundBook:
    """What the exchange keeps of its rounds, under the ledger's lock: the last round's row (what
    node/train/loop.py adds to metrics), the last 100 rounds' usage and the totals (TOTALED)."""

    def __init__(self):
        self.used_by_sender: Counter[str] = Counter()
        self.tiers_used: Counter[str] = Counter()  # behavior tier -> external rollouts trained on
        self.last_round: dict = {}
        self.history: deque[dict] = deque(maxlen=100)  # per-round usage, for `swarm-node status`
        self.totals: Counter[str] = Counter()  # TOTALED over every round, for `swarm-node status`

    def record(self, ex, round_index: int, received: int, flat: int, audited: int, chosen: list,
               work: Counter, seconds: dict[str, float], refused: int) -> None:
        """Round `round_index` collected: `chosen` used, `audited` audited, `work` and `seconds` since
        the last collect (node/peers/ledger.py `take_round`), `refused` peer messages refused since."""
        tiers = Counter(str(r.tier) for g in chosen for r in g.rollouts)
        reasons = Counter(reason for g in chosen for reason in g.meta["tier_reasons"])
        self.used_by_sender.update(g.origin for g in chosen)
        self.tiers_used.update(tiers)
        self.history.append({"round": round_index, "local_groups": ex.publisher.local_groups,
                             "external_groups_received": received, "external_groups_used": len(chosen),
                             "external_groups_dropped": (0 if ex.options.composition == "cross_actor" else flat)
                                                        + refused,
                             "groups_verified": work["groups_verified"], "groups_audited": audited,
                             "exchange_s": round(sum(seconds.values()), 6),
                             **{f"tier{t}_rollouts": tiers.get(str(t), 0) for t in TIERS}})
        self.last_round = round_row(ex, received, flat, audited, chosen, tiers, reasons, round_index, seconds, work)
        self.totals.update({key: self.last_round[key] for key in TOTALED})


def round_row(ex, received: int, flat: int, audited: int, chosen: list, tiers: Counter, reasons: Counter,
              round_index: int, seconds: dict[str, float], work: Counter) -> dict:
        """What the round's metrics row gets from the exchange (node/train/loop.py adds it)."""
        return {
            "external_received": received,
            "external_used": len(chosen),
            "external_samples_used": sum(len(g.correct) for g in chosen),  # their share correct: the next / this
            "external_correct_used": sum(sum(g.correct) for g in chosen),
            "external_zero_variance": flat,
            "groups_audited": audited,
            "groups_verified_unused": max(0, work["groups_verified"] - len(chosen)),
            "external_used_by_sender": dict(Counter(g.origin for g in chosen)),
            "external_tiers": {str(t): tiers.get(str(t), 0) for t in TIERS},
            "external_tier_reasons": dict(reasons),
            "external_staleness_rounds": [round_index - g.meta["sender_round"] for g in chosen],
            "pool_size": len(ex.pool),
            "t_verify": round(ex.verify_budget.spent, 6),  # the training thread's verification seconds
            "verify_budget_exhausted": ex.verify_budget.deferred,  # picks and audits left for the budget
            "groups_verified_ahead": work["groups_verified_ahead"],  # by the ingest worker, since the last collect
            "keys_benched": len(ex.pool.bench.benched_now(round_index)),
            "hint_requests_waiting": len(ex.hint_traffic.requests),
            "peers_connected": len(ex.transport.peers()),
            **ex.publisher.shared,
            **{key: float(work[key]) for key in EXCHANGE_WORK},
            **{f"t_exchange_{phase}": value for phase, value in seconds.items()},
        }
