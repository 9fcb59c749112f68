"""Two `swarm-node join` processes on one host with the default listen address (a free port),
configured only through SWARM_NODE_* variables: the printed "others can join with" addresses are
real (a second node joins with one of them) and the two nodes do not collide on a port."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from node.observe.metrics import read_metrics
from tests.support.processes import repo_env
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow

HEADLESS = {"SWARM_NODE_SWARM__MIN_ROUND_S": "0.4", "SWARM_NODE_RUN__THREADS": "1",
            "SWARM_NODE_RUN__ROUNDS": "400", "SWARM_NODE_RUN__CHECKPOINT_EVERY": "50",
            "SWARM_NODE_SWARM__NAME": "freeports"}
JOIN_LINE = re.compile(r"swarm-node join --peers (\S+)")


def start(popen, run_dir: Path, log: Path, **env: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "node.cli", "join", "--preset", "tiny", "--quiet", "--run-dir", str(run_dir)]
    return popen(cmd, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=repo_env(**{**HEADLESS, **env}))



def printed_addrs(log: Path) -> list[str]:
    return JOIN_LINE.findall(log.read_text(errors="replace"))


def tcp_port(addr: str) -> int:
    match = re.search(r"/tcp/(\d+)/", addr)
    assert match, f"no tcp port in {addr}"
    return int(match.group(1))


def test_default_listen_uses_free_ports_and_printed_addresses_are_dialable(tmp_path, processes):
    a, b = tmp_path / "a", tmp_path / "b"
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    procs = [start(processes, a, log_a)]
    wait_until(lambda: (a / "node.json").exists() and printed_addrs(log_a), "node A to print its addresses",
               timeout=90, procs=procs, step=0.25)
    addrs_a = printed_addrs(log_a)
    info_a = json.loads((a / "node.json").read_text())
    assert addrs_a == info_a["listen_addrs"]  # what is printed is what node.json says
    assert all(tcp_port(x) > 0 for x in addrs_a), addrs_a  # never the /tcp/0 we asked for
    assert len({tcp_port(x) for x in addrs_a}) == 1
    loopback = [x for x in addrs_a if x.startswith("/ip4/127.0.0.1/")]
    assert loopback, f"no loopback address printed: {addrs_a}"

    procs.append(start(processes, b, log_b, SWARM_NODE_SWARM__PEERS=json.dumps(loopback)))  # joins with the print
    wait_until(lambda: (b / "node.json").exists() and printed_addrs(log_b), "node B to print its addresses",
               timeout=90, procs=procs, step=0.25)
    assert tcp_port(printed_addrs(log_b)[0]) not in (0, tcp_port(addrs_a[0]))

    def b_trains_on_a() -> bool:
        used = {s for r in read_metrics(b) for s, n in r.get("external_used_by_sender", {}).items() if n > 0}
        return info_a["peer_id"] in used

    wait_until(b_trains_on_a, "node B to train on groups from A, dialed at A's printed address", procs=procs,
               timeout=90, step=0.25)
