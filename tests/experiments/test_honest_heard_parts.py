"""The parts of the issue-31 harness, without processes (seconds): the flooding origins' content
passes a real tiny node's verification as valid, distinct and trainable; the metrics tail, the
status parsing and the figures compute what node/labs/honest_heard.py says they do."""
from __future__ import annotations

import json

from node.scoring.verifiers import Verifier
from node.service.assembly import memory_bus_node
from node.tasks import make_source
from node.hostile.flood_origins import KIND, Origin, _ContentOnly
from node.hostile.peer import HostilePeer
from node.labs.honest_heard import (
    MetricsTail,
    Probe,
    Sample,
    established_from_reply,
    establishment,
    node_figures,
    split_keys,
)
from proto import swarm_pb2
from protocol import MemoryBus, MemoryTransport, NodeIdentity, topic_name

SWARM = "hh"
A, X, Y = "12D3KooWhonest", "12D3KooWattackerX", "12D3KooWattackerY"


def test_every_origin_message_is_valid_distinct_and_trainable_at_a_real_node(tmp_path, tiny_config):
    cfg = tiny_config(f"swarm.name={SWARM}")
    bus = MemoryBus()
    receiver = memory_bus_node(cfg, tmp_path / "receiver", bus, "receiver")
    origins = []
    for i in range(2):
        transport = MemoryTransport(bus, f"origin-{i}")
        transport.start()
        identity = NodeIdentity.generate()
        peer = HostilePeer(KIND, _ContentOnly(), SWARM, make_source(cfg.tasks.source, cfg.tasks.datasets,
                                                                    cfg.tasks.seed),
                           Verifier.from_config(cfg.verifier), seed=11 + 7919 * i, per_step=0, identity=identity)
        origins.append(Origin(transport, peer, topic_name(SWARM, "rollouts")))
    for origin in origins:
        origin.send(12, 0)
    row = receiver.run_round(0)
    status = receiver.exchange.status()
    assert [o.counters["messages"] for o in origins] == [12, 12]
    assert not {k: v for k, v in status["rejected_by_reason"].items() if v}, status["rejected_by_reason"]
    assert row["external_received"] == 24 and row["external_zero_variance"] == 0, row  # all have variance
    assert set(row["external_used_by_sender"]) <= {o.key for o in origins} and row["external_used"] > 0
    accepted = {p.peer_id: p.accepted for p in status["peers"]}
    assert all(accepted.get(o.key) == 12 for o in origins), accepted  # each key its own origin


def test_split_keys_spreads_them_evenly():
    assert split_keys(32, 4) == [8, 8, 8, 8]
    assert split_keys(5, 2) == [3, 2]
    assert split_keys(2, 4) == [1, 1]  # never an empty process


def test_metrics_tail_returns_complete_rows_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == []  # no file yet
    path.write_text(json.dumps({"round": 0}) + "\n" + '{"round": 1')  # a torn last line waits
    assert tail.read() == [{"round": 0}]
    with open(path, "a") as f:
        f.write("}\n")
    assert tail.read() == [{"round": 1}] and tail.read() == []


def test_established_keys_are_read_from_the_status_reply():
    reply = swarm_pb2.StatusReply()
    if "established" in {f.name for f in reply.DESCRIPTOR.fields}:  # the map key -> promotion time
        reply.established[A] = 1000.0
        assert established_from_reply(reply) == {A: {"at": 1000.0, "first_seen": None}}
    else:  # older replies: flattened counters, or nothing at all
        assert established_from_reply(reply) is None
        reply.ingest[f"established/{A}"] = 1000
        assert established_from_reply(reply) == {A: {"at": 1000.0, "first_seen": None}}


def probe_with(tmp_path, samples: list[Sample], rows: list[tuple[float, dict]]) -> Probe:
    probe = Probe("b", tmp_path)
    probe.samples = samples
    probe.rows, probe._times = rows, [t for t, _ in rows]
    return probe


def sample(t: float, verified: int, established=None) -> Sample:
    return Sample(t, int(t), {A: verified}, "ingest.checked_by_peer", established, [A])


def test_figures_count_rounds_seconds_and_the_attackers_share(tmp_path):
    # five 1-s intervals; A verified in four of them; one round a second, A's group in three of five
    samples = [sample(100.0 + i, v) for i, v in enumerate([0, 3, 6, 6, 9, 12])]
    used = [{A: 1}, {A: 1, X: 1}, {X: 1}, {A: 2, Y: 1}, {Y: 1}]
    rows = [(101.0 + i, {"external_used_by_sender": u, "external_received": 2, "external_zero_variance": 1,
                         "pass_rate": 0.5}) for i, u in enumerate(used)]
    f = node_figures(probe_with(tmp_path, samples, rows), A, 100.0, 105.0, attackers={X, Y})
    assert f["rounds"] == 5 and f["honest_trained_rounds"] == 3 and f["honest_trained_fraction"] == 0.6
    assert f["intervals"] == 5 and f["honest_verified_seconds"] == 0.8 and not f["honest_verified_every_second"]
    assert f["honest_verified_max_gap_s"] == 2.0 and f["honest_verified_per_s"] == 2.4
    assert f["groups_used"] == 8 and f["attacker_share"] == 0.5 and f["attacker_keys_share"] == 0.5
    assert f["rounds_in_window_without_honest"] == 2 and f["external_zero_variance"] == 5
    settled = node_figures(probe_with(tmp_path, samples, rows), A, 100.0, 105.0, settle_s=3.0)
    assert settled["rounds"] == 2 and settled["honest_verified_every_second"]  # from 103 s on
    assert settled["groups_used"] == 8  # the share still counts the whole window


def test_establishment_holds_keys_to_young_seconds_and_the_interval():
    ok = sample(500.0, 0, {A: {"at": 50.0, "first_seen": None}, X: {"at": 420.0, "first_seen": None}})
    e = establishment(ok, A, {X, Y}, flood_start=100.0, young_s=300.0, interval_s=60.0)
    assert e["rate_ok"] and e["attacker_established"] == 1 and e["attacker_established_after_s"] == [320.0]
    early = sample(500.0, 0, {A: {"at": 50.0, "first_seen": None}, X: {"at": 130.0, "first_seen": None},
                              Y: {"at": 150.0, "first_seen": None}})
    e = establishment(early, A, {X, Y}, flood_start=100.0, young_s=300.0, interval_s=60.0)
    assert not e["rate_ok"] and e["attacker_sooner_than_young"] == 2 and e["gaps_below_interval"] == 1
    assert establishment(sample(500.0, 0, None), A, {X}, 100.0, 300.0, 60.0)["available"] is False


def test_polls_back_to_back_make_no_interval_of_their_own(tmp_path):
    # a phase change polls twice within milliseconds: that pair is no second without verification
    samples = [sample(100.0, 0), sample(101.0, 5), sample(101.01, 5), sample(102.0, 9)]
    f = node_figures(probe_with(tmp_path, samples, []), A, 100.0, 102.0)
    assert f["intervals"] == 2 and f["honest_verified_every_second"], f
