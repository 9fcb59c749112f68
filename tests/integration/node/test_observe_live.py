"""The observe listeners of real processes: `swarm-node join` (tiny preset, p2pd on 127.0.0.1): /metrics
scraped twice, values moving; loopback only; no endpoint ever serves the private key; it ends with
the node. `swarm-node testnet` (in-process memory nodes): one page with every node while it runs."""
from __future__ import annotations

import base64
import json
import re
import socket
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from node.observe.metrics import read_metrics
from tests.support.processes import repo_env
from protocol import NodeIdentity
from tests.unit.observe.test_observe import get, non_loopback_ip, value
from tests.integration.node.test_swarm_join import ROOT, start
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

ARGS = ["join", "--preset", "tiny", "--quiet", "--listen", "/ip4/127.0.0.1/tcp/0", "--swarm", "observe",
        "--set", "swarm.min_round_s=0.3", "--set", "run.threads=1", "--set", "eval.every=2"]
ENDPOINTS = ("/", "/page.js", "/api/state", "/metrics", "/no-such-page")


def scrape(address: str) -> dict:
    status, body = get(f"http://{address}/metrics")
    assert status == 200
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def key_forms(key_file: Path) -> list[bytes]:
    """The private key as raw bytes, hex, base64 and PEM body: none may appear in a response."""
    seed = NodeIdentity.load_or_generate(key_file).private_seed()
    pem_body = b"".join(line for line in key_file.read_bytes().splitlines() if not line.startswith(b"-----"))
    b64 = base64.b64encode(seed)
    return [seed, seed.hex().encode(), seed.hex().upper().encode(), b64, b64.rstrip(b"="),
            base64.urlsafe_b64encode(seed).rstrip(b"="), pem_body, base64.b64decode(pem_body).hex().encode()]


def test_metrics_move_between_scrapes_on_loopback_and_never_show_the_key(tmp_path, processes):
    a, b = tmp_path / "a", tmp_path / "b"
    procs = [start(processes, a, args=[*ARGS, "--rounds", "80"])]
    wait_until(lambda: (a / "node.json").exists(), "A to listen", procs=procs, timeout=90, step=0.25)
    info = json.loads((a / "node.json").read_text())
    procs.append(start(processes, b, info["listen_addrs"], args=[*ARGS, "--rounds", "5000"]))
    address = info["metrics"]
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1"  # the default: loopback only
    other = non_loopback_ip()
    if other is not None:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((other, int(port)), timeout=5).close()

    wait_until(lambda: len(read_metrics(a)) >= 3, "3 rounds on A", procs=procs, timeout=120, step=0.25)
    first = scrape(address)
    wait_until(lambda: len(read_metrics(a)) >= value(first, "swarm_node_round") + 4, "4 more rounds",
               procs=procs, timeout=120, step=0.25)
    second = scrape(address)
    assert value(second, "swarm_node_round") >= value(first, "swarm_node_round") + 4
    assert value(second, "swarm_node_policy_version") > value(first, "swarm_node_policy_version")
    assert 0.0 <= value(second, "swarm_node_reward_mean") <= 1.0
    assert 0.0 <= value(second, "swarm_node_heldout_pass1_ratio") <= 1.0
    assert value(second, "swarm_node_generate_seconds") > 0 and value(second, "swarm_node_tokens_per_second") > 0
    assert value(second, "swarm_node_transport_daemon_state") == 1  # p2pd running
    assert value(second, "swarm_node_process_resident_memory_bytes") > 50e6
    wait_until(lambda: value(scrape(address), "swarm_node_messages_accepted_total") > 0
               and value(scrape(address), "swarm_node_peers_connected") == 1, "A to accept B's messages",
               procs=procs, timeout=120, step=0.25)

    forms = key_forms(a / "identity.key")
    for path in ENDPOINTS:
        status, body = get(f"http://{address}{path}")
        assert status == (404 if path == "/no-such-page" else 200)
        assert not [f for f in forms if f in body], f"{path} serves the private key"
    state = json.loads(get(f"http://{address}/api/state")[1])
    assert state["peer_id"] == info["peer_id"] and state["connected"] == 1
    assert [p["connected"] for p in state["peers"] if p["peer_id"] == json.loads((b / "node.json").read_text())[
        "peer_id"]] == [True]

    procs[0].wait(timeout=180)  # A ends after its 80 rounds: the listener ends with it
    assert procs[0].returncode == 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=5).close()


def test_testnet_serves_one_page_with_every_node_while_it_runs(tmp_path, processes):
    log = tmp_path / "testnet.log"
    cmd = [sys.executable, "-m", "node.cli", "testnet", "--transport", "memory", "--nodes", "3", "--rounds", "80",
           "--quiet", "--set", "eval.every=10", "--out", str(tmp_path / "out")]
    with log.open("wb") as fh:
        procs = [processes(cmd, cwd=ROOT, stdout=fh, stderr=fh, env=repo_env())]

    def page_url() -> str | None:
        found = re.search(r"live testnet page on (http://127\.0\.0\.1:\d+/)", log.read_text())
        return found and found.group(1)

    url = wait_until(page_url, "the page's URL to be printed", procs=procs, timeout=60, step=0.25)

    def every_node_drawn() -> bool:
        nodes = json.loads(get(url + "api/state")[1])["nodes"]
        return len(nodes) == 3 and all(len(n["curves"]["reward"]) >= 5 for n in nodes)

    wait_until(every_node_drawn, "5 rounds of every node on the page", procs=procs, timeout=120, step=0.25)
    state = json.loads(get(url + "api/state")[1])
    assert [n["name"] for n in state["nodes"]] == ["node0", "node1", "node2"]
    assert state["kind"] == "testnet" and state["run_dir"].endswith("mix4-4-seed0")
    assert all(n["state"] == "up" and n["peers"] == 2 for n in state["nodes"])  # the dashboard's rows
    assert get(url)[0] == 200 and b"page.js" in get(url)[1]
    assert procs[0].wait(timeout=300) == 0
    with pytest.raises(ConnectionRefusedError):  # the page ends with the testnet
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1].strip("/"))), timeout=5).close()


def test_train_serves_metrics_too_without_swarm_series(tmp_path, processes):
    log = tmp_path / "train.log"
    cmd = [sys.executable, "-m", "node.cli", "train", "--preset", "tiny", "--rounds", "100000", "--quiet",
           "--set", "run.threads=1", "--run-dir", str(tmp_path / "run")]
    with log.open("wb") as fh:
        procs = [processes(cmd, cwd=ROOT, stdout=fh, stderr=fh, env=repo_env())]

    def address() -> str | None:
        found = re.search(r"live page on http://(127\.0\.0\.1:\d+)/", log.read_text())
        return found and found.group(1)

    wait_until(address, "the listener's address to be printed", procs=procs, timeout=90, step=0.25)
    wait_until(lambda: len(read_metrics(tmp_path / "run")) >= 3, "3 rounds", procs=procs, timeout=120, step=0.25)
    # the gauge moves on just after the round's row is written: a starved node may be scraped in between
    fams = wait_until(lambda: (f := scrape(address())) and value(f, "swarm_node_round") >= 3 and f,
                      "the round gauge to reach 3", procs=procs, timeout=30, step=0.25)
    assert 0.0 <= value(fams, "swarm_node_reward_mean") <= 1.0
    assert "swarm_node_messages_accepted" not in fams and "swarm_node_peers_connected" not in fams
    state = json.loads(get(f"http://{address()}/api/state")[1])
    assert "peer_id" not in state and len(state["curves"]["reward"]) >= 3
