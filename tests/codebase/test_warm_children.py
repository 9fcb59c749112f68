"""The suite's warm children (tests/support/warm_children.py): a `python -m node.cli` child started the usual
way is run by the session's fork server, and looks to its parent like the process it replaces: the
same output and exit code, stop signals forwarded, killed with its stand-in; a child the server
cannot run (another environment) starts as usual."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from node.observe.metrics import read_metrics
from policy.checkpoint import latest_checkpoint_path
from tests.support.processes import repo_env
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # the server is started for sessions with slow tests
COLD_CPU_S = 1.0  # importing torch alone takes more; a stand-in's own start-up takes a few hundredths


@pytest.fixture
def server(warm_children):
    if warm_children is None:
        pytest.skip("warm children are off (SWARM_TEST_WARM=0)")
    wait_until(lambda: os.path.exists(os.environ["SWARM_TEST_WARM_SOCKET"]), "the fork server to listen",
               procs=[warm_children], timeout=300, step=0.25)  # it imports torch on a busy machine
    return warm_children


def forked_children(server) -> list[int]:
    return [int(pid) for pid in Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()]


def run_measured(args: list[str], **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """`python -m node.cli ARGS`, and the CPU seconds the process this test started used itself."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "node.cli", *args], cwd=ROOT, env=repo_env(**env),
                          capture_output=True, text=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


COLD = {"SWARM_TEST_COLD": "1"}  # an environment the server was not started with: it answers "fallback"


def test_a_command_prints_and_exits_as_it_does_started_cold(server):
    for args, code in ((["config", "--set", "sampling.temperature=0.5"], 0),
                       (["config", "--set", "loss.name=tis(minpro)"], 2)):
        (warm, _), (cold, _) = run_measured(args), run_measured(args, **COLD)
        assert warm.returncode == cold.returncode == code, (warm.stderr, cold.stderr)
        assert (warm.stdout, warm.stderr) == (cold.stdout, cold.stderr)


def first_round(run_dir: Path) -> dict:
    (row,) = read_metrics(run_dir)
    return {k: v for k, v in row.items() if not (k.startswith("t_") or k == "tokens_per_s")}  # the machine's timing


def test_a_warm_node_imports_nothing_itself_and_trains_the_round_a_cold_one_trains(server, tmp_path):
    args = ["train", "--preset", "tiny", "--rounds", "1", "--quiet", "--set", "run.threads=1", "--run-dir"]
    warm, warm_cpu = run_measured([*args, str(tmp_path / "warm")])
    cold, cold_cpu = run_measured([*args, str(tmp_path / "cold")], **COLD)
    assert warm.returncode == cold.returncode == 0, (warm.stderr[-2000:], cold.stderr[-2000:])
    assert warm_cpu < COLD_CPU_S <= cold_cpu, (warm_cpu, cold_cpu)  # the stand-in imported no torch
    assert first_round(tmp_path / "warm") == first_round(tmp_path / "cold")


def start_training(popen, run_dir: Path) -> subprocess.Popen:
    log = open(run_dir.parent / "train.log", "ab")
    return popen([sys.executable, "-m", "node.cli", "train", "--preset", "tiny", "--rounds", "100000", "--quiet",
                  "--set", "run.threads=1", "--set", "run.checkpoint_every=1000", "--run-dir", str(run_dir)],
                 cwd=ROOT, env=repo_env(),
                 stdout=log, stderr=log)


def test_sigterm_reaches_the_forked_node_and_a_killed_stand_in_takes_it_along(server, tmp_path, processes):
    first, second = tmp_path / "first", tmp_path / "second"
    before = set(forked_children(server))
    proc = start_training(processes, first)
    wait_until(lambda: len(read_metrics(first)) >= 2, "2 rounds", procs=[proc], timeout=60, step=0.1)
    (child,) = set(forked_children(server)) - before
    proc.send_signal(signal.SIGTERM)  # the node's graceful stop (a stand-in killed by it would say -15)
    assert proc.wait(timeout=60) == 0, (tmp_path / "train.log").read_text()[-2000:]
    assert latest_checkpoint_path(first) is not None  # of the last round: none periodic in 1000 rounds
    assert child not in forked_children(server)

    proc = start_training(processes, second)
    wait_until(lambda: len(read_metrics(second)) >= 2, "2 rounds", procs=[proc], timeout=60, step=0.1)
    (child,) = set(forked_children(server)) - before
    proc.kill()  # SIGKILL cannot be forwarded: the server sees its stand-in's connection close
    assert proc.wait(timeout=10) == -signal.SIGKILL
    wait_until(lambda: child not in forked_children(server), "the forked node to be killed too", timeout=10)
