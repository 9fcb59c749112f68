"""The operator's say over peers' keys (issue 42 item 8): `swarm-node peers --ban/--unban/--demote`
writes <run_dir>/operator.json (node/peers/operator.py); a node applies it within a round and after a
restart, and lists its keys with their network groups. Real tiny nodes, real exchange, real signed
envelopes on the in-process bus."""
from __future__ import annotations

import json

import pytest

from node.cli import main
from node.observe.control import status_reply
from node.peers.operator import OPERATOR_FILE, OperatorDecisions
from protocol import MemoryBus
from tests.unit.peers.test_admission_state import Peer, receiver


def established_peer(tmp_path):
    bus = MemoryBus()
    node = receiver(tmp_path, bus)  # two credits make a key established, no waiting time
    peer = Peer(bus, "lab")
    for round_index in range(3):
        peer.send(node, round_index, solved=False)
        node.exchange.collect(round_index)
    assert not node.exchange.pool.admission.is_young(peer.key)
    return bus, node, peer


def test_a_banned_key_is_refused_dropped_and_young_and_stays_banned_after_a_restart(tmp_path):
    bus, node, peer = established_peer(tmp_path)
    peer.send(node, 10, solved=False)
    assert main(["peers", "--run-dir", str(tmp_path), "--ban", peer.key]) == 0
    assert node.exchange.collect(3) == []  # the pooled group dropped, the new one refused
    status = node.exchange.status()
    assert status["rejected_by_reason"].get("banned", 0) >= 1
    assert node.exchange.pool.admission.is_young(peer.key) and node.exchange.pool.held_by(peer.key) == 0
    listed = {k["key"]: k for k in status["admission"]["keys"]}
    assert listed[peer.key]["operator_banned"] and listed[peer.key]["network_group"] == "host:lab"

    node.exchange.close()
    node.exchange.transport.close()  # off the bus: the restarted node takes its name
    restarted = receiver(tmp_path, bus)  # a new node on the same run dir reads the file at start
    assert restarted.exchange.ingress.is_banned(peer.key)
    assert main(["peers", "--run-dir", str(tmp_path), "--unban", peer.key]) == 0
    peer.send(restarted, 11, solved=False)
    assert [g.origin for g in restarted.exchange.collect(0)] == [peer.key]  # heard again (young: one slot)
    assert main(["peers", "--run-dir", str(tmp_path), "--unban", peer.key]) == 1  # nothing to lift


def test_a_demoted_key_is_young_again_and_earns_its_place_anew(tmp_path):
    bus, node, peer = established_peer(tmp_path)
    assert main(["peers", "--run-dir", str(tmp_path), "--demote", peer.key]) == 0
    node.exchange.collect(3)
    admission = node.exchange.pool.admission
    assert admission.is_young(peer.key) and admission.keys[peer.key].credited == 0
    for round_index in range(4, 6):  # two credits again: established again, and the old demotion
        peer.send(node, round_index, solved=False)  # does not undo it (it was decided before)
        node.exchange.collect(round_index)
    assert not admission.is_young(peer.key)
    assert OperatorDecisions.load(tmp_path).demoted[peer.key] > 0


def test_keys_reach_the_status_reply_with_their_groups(tmp_path):
    _, node, peer = established_peer(tmp_path)
    reply = status_reply({**node.exchange.status(), "round": 3, "policy_version": 0, "uptime_s": 1.0})
    [state] = [k for k in reply.keys if k.key == peer.key]
    assert state.established and state.network_group == "host:lab" and state.credited >= 2


def test_a_malformed_operator_file_is_named_and_the_last_decisions_kept(tmp_path, caplog):
    _, node, peer = established_peer(tmp_path)
    assert main(["peers", "--run-dir", str(tmp_path), "--ban", peer.key]) == 0
    node.exchange.collect(3)
    (tmp_path / OPERATOR_FILE).write_text("{not json")
    node.exchange.collect(4)
    assert node.exchange.ingress.is_banned(peer.key)  # kept
    assert any("operator.json is not an operator file" in r.getMessage() for r in caplog.records)
    assert main(["peers", "--run-dir", str(tmp_path), "--ban", "x"]) == 2  # a clear error, no traceback


def test_the_operator_file_round_trips_and_refuses_nonsense(tmp_path):
    decisions = OperatorDecisions()
    decisions.ban("a")
    decisions.demote("b")
    decisions.save(tmp_path)
    assert OperatorDecisions.load(tmp_path) == decisions
    (tmp_path / OPERATOR_FILE).write_text(json.dumps({"banned": ["a"]}))
    with pytest.raises(ValueError, match="not an operator file"):
        OperatorDecisions.load(tmp_path)
