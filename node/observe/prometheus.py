"""/metrics of one node: a custom collector that reads the node's state at scrape time (the newest
metrics row, SwarmExchange.status(), the transport's counters), in a registry of its own, so several
nodes in one process never mix their series. Label values come from fixed sets (rejection reasons,
behavior tiers, ingest drop reasons, transport counter names): no label holds a peer id, so the
series count stays bounded however many keys show up; peer scores are one gauge histogram."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeHistogramMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from node.observe.state import NodeObserver

NS = "swarm_node"
# protocol/scoring.py: scores are capped at +10 and a peer at -10 is banned
SCORE_BUCKETS = (-10.0, -5.0, -2.0, -1.0, 0.0, 1.0, 2.0, 5.0, 10.0)
# metrics row key -> (metric name, help): the newest round's values
ROW_GAUGES = {
    "reward_mean": ("reward_mean", "mean reward of this node's own unhinted samples in the last round"),
    "pass_rate": ("train_pass_ratio", "share of this node's own unhinted samples that were correct, last round"),
    "entropy_mean": ("sampling_entropy_nats", "mean per-token entropy of the distribution this node's own last-round "
                     "tokens were drawn from (absent when the backend measures none: vLLM)"),
    "distinct_completions": ("distinct_completions_per_group", "distinct completions per own group, last round (mean)"),
    "flat_group_share": ("flat_group_ratio", "share of this node's own groups of the last round whose rewards were all "
                         "equal"),
    "loss": ("loss", "training loss of the last update"),
    "grad_norm": ("grad_norm", "gradient norm of the last update, before clipping"),
    "skipped_step_frac": ("skipped_steps_ratio", "share of the last update's optimizer steps skipped because their "
                          "gradient was NaN or infinite (policy/learner.py)"),
    "t_generate": ("generate_seconds", "time the last round spent generating rollouts (scoring excluded)"),
    "t_exchange": ("exchange_seconds", "time the last round spent sharing and collecting groups"),
    "t_train": ("update_seconds", "time the last round's policy update took"),
    "t_round": ("round_seconds", "time the last round took (a held-out evaluation excluded)"),
    "tokens_per_s": ("tokens_per_second", "completion tokens generated per second of the last round"),
    "groups_trained": ("groups_trained", "groups the last update trained on (own and peers')"),
    "external_used": ("external_groups_used", "peers' groups the last update trained on"),
    "external_received": ("external_groups_received", "peers' groups that passed the cheap checks last round"),
    "groups_verified": ("external_groups_verified", "peers' groups verified last round (the mix's picks and the "
                        "audit)"),
}
# the exchange's phases (node/peers/ledger.py EXCHANGE_PHASES, and hint serving from node/train/loop.py)
EXCHANGE_PARTS = ("skim", "ingress", "precheck", "rebuild", "score", "retokenize", "tier", "publish", "hints")
# status()["exchange_totals"] counts -> the `kind` label of swarm_node_exchange_groups_total
GROUP_TOTALS = {"external_received": "received", "groups_verified": "verified", "external_used": "used",
                "groups_audited": "audited", "groups_verified_unused": "verified_unused"}
# transport counters that are levels, not counts (protocol/transports/p2pd/transport.py stats())
TRANSPORT_GAUGES = {"daemon_state": "p2pd daemon: 0 starting, 1 running, 2 restarting, 3 closed",
                    "dht_peers": "peers the last DHT lookup of our own id named",
                    "outbound_queued": "messages waiting to be published",
                    "reachability": "AutoNAT's verdict on this node: 0 unknown, 1 public (peers can dial it), "
                                    "2 private (behind NAT: peers reach it through relays)",
                    "relay_reservations": "relay slots this node holds now (a private node's relayed addresses)",
                    "relay_serving": "1 while this node serves as a circuit relay",
                    "relayed_addrs": "relayed (/p2p-circuit) addresses this node announces",
                    "relayed_peers": "peers connected through a relay only (they get our messages on streams)"}
TRANSPORT_SKIPPED = {"daemon_pid", "connected_peers"}  # an id; the same as swarm_node_peers_connected


def _gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"{NS}_{name}", doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), float(value))
    return family


def _counter(name: str, doc: str, label: str, values: dict[str, float]) -> CounterMetricFamily:
    family = CounterMetricFamily(f"{NS}_{name}", doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([str(key)], float(value))
    return family


class NodeCollector(Collector):
    def __init__(self, observer: NodeObserver):
        self.observer = observer

    def collect(self):
        o = self.observer
        info = InfoMetricFamily(NS, "who this node is (public facts only)")
        info.add_metric([], {k: str(o.identity.get(k) or "") for k in ("peer_id", "swarm", "transport")})
        yield info
        progress = o.progress()
        yield _gauge("round", "rounds this node has completed (the index of the round it runs now)", progress["round"])
        yield _gauge("policy_version", "policy updates applied so far", progress["policy_version"])
        last, last_eval = o.history.latest()
        yield from self._rows(last or {}, last_eval)
        status = o.swarm_status()
        if status is not None:
            yield from self._swarm(status)

    def _rows(self, last: dict, last_eval: dict | None):
        for key, (name, doc) in ROW_GAUGES.items():
            if isinstance(last.get(key), (int, float)):
                yield _gauge(name, doc, last[key])
        phases = {p: last[f"t_exchange_{p}"] for p in EXCHANGE_PARTS if isinstance(last.get(f"t_exchange_{p}"), (int, float))}
        if phases:
            family = GaugeMetricFamily(f"{NS}_exchange_phase_seconds", "time the last round's exchange spent per "
                                       "phase (ingress and precheck run on the ingest worker in background mode)",
                                       labels=["phase"])
            for phase, value in phases.items():
                family.add_metric([phase], float(value))
            yield family
        if last_eval is None:
            return  # no evaluation yet (or eval.every = 0): no held-out series rather than a made-up 0
        yield _gauge("heldout_round", "round of the last held-out evaluation", last_eval["round"])
        if last_eval.get("heldout_pass1") is not None:
            yield _gauge("heldout_pass1_ratio", "held-out greedy pass@1 at the last evaluation",
                         last_eval["heldout_pass1"])
        if last_eval.get("heldout_passk") is not None:
            yield _gauge("heldout_passk_ratio", "held-out pass@k at the last evaluation (k sampled answers)",
                         last_eval["heldout_passk"], {"k": str(last_eval.get("heldout_k", ""))})

    def _swarm(self, status: dict):
        yield _counter("external_rollouts_trained_total", "peers' rollouts trained on, by behavior tier "
                       "(0 exact log-probs, 1 aligned, 2 proxy)", "tier", status.get("tiers_used", {}))
        accepted = CounterMetricFamily(f"{NS}_messages_accepted_total", "peers' messages that passed every check")
        accepted.add_metric([], status["accepted"])
        yield accepted
        yield _counter("messages_rejected_total", "peers' messages refused, by reason", "reason",
                       status["rejected_by_reason"])
        peers = status["peers"]
        yield _gauge("peers_connected", "peers connected now", len(status["connected"]))
        yield _gauge("peers_tracked", "peers (keys and connections) with a score", len(peers))
        yield _gauge("peers_banned", "tracked peers serving a ban now", sum(p.banned for p in peers))
        yield _score_histogram([p.score for p in peers])
        yield from _ingest(status.get("ingest", {}))
        totals = status.get("exchange_totals", {})
        yield _counter("exchange_seconds_total", "time the exchange spent per phase since start", "phase",
                       {k.removeprefix("t_exchange_"): v for k, v in totals.items() if k.startswith("t_exchange_")})
        yield _counter("exchange_groups_total", "peers' groups since start: received (passed the cheap checks), "
                       "verified, used, audited, verified_unused", "kind",
                       {kind: totals.get(key, 0.0) for key, kind in GROUP_TOTALS.items()})
        admission = status.get("admission", {})
        yield _gauge("keys_established", "peer keys established at admission (no longer young)",
                     admission.get("established_count", 0))
        yield _gauge("keys_young", "peer keys still young at admission", admission.get("young_count", 0))
        yield _gauge("keys_operator_banned", "peer keys the operator banned (swarm-node peers --ban)",
                     sum(bool(k.get("operator_banned")) for k in admission.get("keys", [])))
        groups = {k.get("network_group") for k in admission.get("keys", []) if k.get("established")}
        yield _gauge("established_network_groups", "network groups holding an established key (of the listed keys)",
                     len(groups))
        yield from _transport(status.get("transport", {}))


def _score_histogram(scores: list[float]) -> GaugeHistogramMetricFamily:
    buckets = [(str(edge), sum(s <= edge for s in scores)) for edge in SCORE_BUCKETS]
    return GaugeHistogramMetricFamily(f"{NS}_peer_score", "scores of the tracked peers now (one histogram, "
                                      "not one series per peer)", buckets=[*buckets, ("+Inf", len(scores))],
                                      gsum_value=sum(scores))


def _ingest(ingest: dict):
    """Background ingest's staging queue (absent when ingest is inline)."""
    if "staged" not in ingest:
        return
    yield _gauge("ingest_staged", "peers' messages waiting to be checked", ingest["staged"])
    checked = CounterMetricFamily(f"{NS}_ingest_checked_total", "peers' messages the ingest worker checked "
                                  "(the Ingress and the cheap checks)")
    checked.add_metric([], ingest.get("checked", 0))
    yield checked
    dropped = CounterMetricFamily(f"{NS}_ingest_dropped_total", "peers' messages dropped unchecked, by reason "
                                  "and sender class", labels=["reason", "sender_class"])
    for key, n in sorted(ingest.get("dropped", {}).items()):
        reason, _, cls = key.partition("/")
        dropped.add_metric([reason, cls], n)
    yield dropped


def _transport(counters: dict):
    topics = GaugeMetricFamily(f"{NS}_transport_topic_peers", "peers in each gossip topic's mesh", labels=["topic"])
    events: dict[str, float] = {}
    for key, value in sorted(counters.items()):
        if key.startswith("topic_peers:"):
            topics.add_metric([key.split(":", 1)[1]], value)
        elif key in TRANSPORT_GAUGES:
            yield _gauge(f"transport_{key}", TRANSPORT_GAUGES[key], value)
        elif key == "daemon_restarts":
            restarts = CounterMetricFamily(f"{NS}_transport_daemon_restarts_total", "p2pd daemon restarts "
                                           "(it exited or its sockets got stuck)")
            restarts.add_metric([], value)
            yield restarts
        elif key not in TRANSPORT_SKIPPED and isinstance(value, (int, float)):
            events[key] = value
    yield topics
    yield _counter("transport_events_total", "transport counters (published, received, dropped_*, dial_*, ...)",
                   "event", events)


def node_registry(observer: NodeObserver) -> CollectorRegistry:
    """A registry of this node alone, with the process's RSS, CPU time and open files
    (swarm_node_process_*; in a process with several nodes each reports the same process)."""
    # collectors that read live state at scrape time declare no names up front
    registry = CollectorRegistry(support_collectors_without_names=True)
    registry.register(NodeCollector(observer))
    ProcessCollector(namespace=NS, registry=registry)
    return registry
