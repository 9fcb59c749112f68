"""node/observe: the listen setting, the tail of metrics.jsonl, the HTTP listener (real sockets on
127.0.0.1), and /metrics of two real tiny nodes in one process on the in-process bus."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from node.config.schema import ConfigError, load_config
from node.observe.address import parse_listen
from node.observe.history import RoundHistory
from node.observe.server import ObserveServer

from tests.support.processes import repo_env

ROOT = Path(__file__).resolve().parents[3]


def get(url: str, host: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def non_loopback_ip() -> str | None:
    """This host's address on its default route, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
        except OSError:
            return None
        ip = s.getsockname()[0]
    return None if ip.startswith("127.") else ip


def test_listen_values_parse_or_fail_naming_the_key():
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:9100") == ("::1", 9100) and parse_listen("localhost:80") == ("127.0.0.1", 80)
    assert parse_listen("") is None
    assert load_config("tiny", None, ["swarm.metrics_listen=''"]).swarm.metrics_listen == ""  # off
    assert load_config("tiny").swarm.metrics_listen == "127.0.0.1:0"  # loopback, a free port, by default
    for bad, says in (("9100", "not HOST:PORT"), ("node.example:9100", "not an IP address"),
                      ("127.0.0.1:70000", "from 0 to 65535"), ("127.0.0.1:http", "is not a number")):
        with pytest.raises(ConfigError, match=f"swarm.metrics_listen: .*{says}"):
            load_config("tiny", None, [f"swarm.metrics_listen={bad}"])


@pytest.mark.slow
def test_join_with_a_bad_listen_value_exits_with_the_error_before_loading_a_model(tmp_path):
    result = subprocess.run([sys.executable, "-m", "node.cli", "join", "--run-dir", str(tmp_path / "n"),
                             "--set", "swarm.metrics_listen=0.0.0.0"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env=repo_env())
    assert result.returncode == 2
    assert "swarm.metrics_listen" in result.stderr and "is not HOST:PORT" in result.stderr, result.stderr
    assert not (tmp_path / "n").exists()


def write_rows(path: Path, rows: list[dict], tail: str = "") -> None:
    with path.open("a") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_history_tails_the_file_thins_long_curves_and_follows_a_rewrite(tmp_path):
    history = RoundHistory(tmp_path, max_points=10)
    assert history.view()["curves"]["reward"] == [] and history.latest() == (None, None)  # no file yet
    path = tmp_path / "metrics.jsonl"
    write_rows(path, [{"round": r, "reward_mean": r / 10} for r in range(3)], tail='{"round": 3, "rew')
    assert history.view()["curves"]["reward"] == [[0, 0.0], [1, 0.1], [2, 0.2]]  # the half-written line waits
    write_rows(path, [], tail='ard_mean": 0.3, "heldout_pass1": 0.5, "heldout_passk": 0.75}\n')
    last, last_eval = history.latest()
    assert last["round"] == 3 and last_eval["heldout_pass1"] == 0.5
    assert history.view()["curves"]["heldout_passk"] == [[3, 0.75]]
    write_rows(path, [{"round": r, "reward_mean": 1.0} for r in range(4, 40)])
    view = history.view()
    curve = view["curves"]["reward"]
    assert len(curve) <= 10 and curve[-1] == [39, 1.0] and curve[0][0] == 0  # thinned, both ends kept
    assert [r["round"] for r in view["recent"]] == list(range(20, 40))  # the table's last rows
    # a resumed node rewrites the file without the rounds after its checkpoint
    tmp = tmp_path / "rewrite.tmp"
    write_rows(tmp, [{"round": r, "reward_mean": 0.5} for r in range(2)])
    os.replace(tmp, path)
    assert history.view()["curves"]["reward"] == [[0, 0.5], [1, 0.5]]


def test_listener_serves_routes_refuses_foreign_hosts_and_stops(tmp_path):
    def broken():
        raise RuntimeError("boom")

    server = ObserveServer("127.0.0.1:0", {"/x": lambda: (b"hello", "text/plain"), "/broken": broken}).start()
    url = f"http://127.0.0.1:{server.port}"
    try:
        assert server.httpd.socket.getsockname()[0] == "127.0.0.1"
        assert get(url + "/x") == (200, b"hello") and get(url + "/x?cache=1")[0] == 200
        assert get(url + "/nope")[0] == 404
        assert get(url + "/broken")[0] == 500  # and the listener lives on
        assert get(url + "/x", host=f"localhost:{server.port}")[0] == 200
        # a web page whose domain name was rebound to 127.0.0.1 cannot read the node
        assert get(url + "/x", host=f"attacker.example:{server.port}")[0] == 403
        request = urllib.request.Request(url + "/x", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError, match="501"):  # read-only
            urllib.request.urlopen(request, timeout=10)
        other = non_loopback_ip()
        if other is not None:  # bound to loopback only: the host's other address has nothing there
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((other, server.port), timeout=5).close()
    finally:
        server.stop()
    assert not server.thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()


def test_a_taken_port_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(OSError, match="metrics_listen=127.0.0.1:0 picks a free one"):
            ObserveServer(f"127.0.0.1:{s.getsockname()[1]}", {})


def families(registry) -> dict:
    from prometheus_client import generate_latest

    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


def value(fams: dict, name: str, **labels) -> float:
    """The sum of the samples called `name` with these labels (the parser names a counter's family
    without its _total)."""
    samples = [s for f in fams.values() for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert samples, f"no sample {name} {labels}"
    return sum(s.value for s in samples)


def test_two_nodes_in_one_process_each_have_their_own_bounded_metrics(tmp_path, tiny_config):
    from node.observe.metrics import read_metrics
    from node.observe.prometheus import node_registry
    from node.observe.state import NodeObserver, loop_progress
    from node.service.assembly import memory_bus_node
    from protocol import MemoryBus, MemoryTransport, topic_name

    tick = [0]
    bus = MemoryBus()
    nodes, registries = [], []
    for name in ("a", "b"):
        cfg = tiny_config("eval.every=2", "swarm.name=obs", f"run.seed={len(nodes)}")
        node = memory_bus_node(cfg, tmp_path / name, bus, name, swarm_clock=lambda: tick[0] * 2.0)
        exchange = node.exchange
        nodes.append(node)
        registries.append(node_registry(NodeObserver(tmp_path / name, name, {"peer_id": exchange.peer_id},
                                                     loop_progress(node), exchange.status)))
    garbage = MemoryTransport(bus, "garbage")
    garbage.start()
    for tick[0] in range(4):
        garbage.publish(topic_name("obs", "rollouts"), b"not an envelope")
        for node in nodes:
            node.run_one(4)
    scraped = [families(r) for r in registries]
    assert {next(iter(f["swarm_node_info"].samples)).labels["peer_id"] for f in scraped} == \
        {n.exchange.peer_id for n in nodes}  # each registry reports its own node
    for fams, node in zip(scraped, nodes):
        assert value(fams, "swarm_node_round") == 4 and value(fams, "swarm_node_policy_version") == 4
        assert value(fams, "swarm_node_reward_mean") == node.metrics.last["reward_mean"]
        assert value(fams, "swarm_node_sampling_entropy_nats") == node.metrics.last["entropy_mean"] > 0
        assert value(fams, "swarm_node_flat_group_ratio") == node.metrics.last["flat_group_share"]
        assert value(fams, "swarm_node_heldout_pass1_ratio") == node.metrics.last_heldout
        assert value(fams, "swarm_node_heldout_round") == 3
        assert value(fams, "swarm_node_messages_accepted_total") > 0
        assert value(fams, "swarm_node_messages_rejected_total", reason="malformed") == 4
        assert value(fams, "swarm_node_external_rollouts_trained_total", tier="0") > 0
        # the exchange's cost, per phase and per group kind (node/peers/exchange.py)
        assert value(fams, "swarm_node_exchange_phase_seconds", phase="ingress") > 0
        assert value(fams, "swarm_node_exchange_seconds_total", phase="score") > 0
        verified = value(fams, "swarm_node_exchange_groups_total", kind="verified")
        assert verified == sum(r.get("groups_verified", 0) for r in read_metrics(node.run_dir)) > 0
        assert value(fams, "swarm_node_exchange_groups_total", kind="received") >= verified
        tracked = value(fams, "swarm_node_peers_tracked")
        assert tracked >= 2 and value(fams, "swarm_node_peer_score_gcount") == tracked
        assert value(fams, "swarm_node_peer_score_bucket", le="+Inf") == tracked
        assert value(fams, "swarm_node_process_resident_memory_bytes") > 10e6
        # bounded cardinality: no series carries a peer id but the node's own info series
        labelled = {k for f in fams.values() if f.name != "swarm_node_info" for s in f.samples for k in s.labels}
        assert labelled <= {"tier", "reason", "sender_class", "topic", "event", "k", "le", "phase", "kind"}, labelled
