"""A stop signal (systemctl stop, docker stop, Ctrl-C) finishes the round in progress and checkpoints
it: a stopped node resumes where it stopped, not at its last periodic checkpoint."""
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from node.train.loop import Node
from node.observe.metrics import RoundTable, read_metrics
from node.service.shutdown import StopOnSignals
from policy.checkpoint import latest_checkpoint_path
from tests.support.processes import repo_env, stop
from tests.support.tiny_node import tiny_cfg
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]


def checkpoint_round(run_dir: Path) -> int | None:
    path = latest_checkpoint_path(run_dir)
    return None if path is None else int(path.name.split("-")[1])


def test_first_signal_asks_to_stop_the_second_stops_now():
    previous = signal.getsignal(signal.SIGTERM)
    with StopOnSignals() as stopping:
        assert not stopping.is_set()
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal to this (main) thread
        assert stopping.wait(5)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            stopping.wait(5)  # the handler runs at the next bytecode; this never returns normally
    assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored on exit


def test_handlers_are_left_alone_outside_the_main_thread():
    seen = {}

    def enter():
        with StopOnSignals():
            seen["handler"] = signal.getsignal(signal.SIGTERM)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join(10)
    assert seen["handler"] is signal.getsignal(signal.SIGTERM)


class StopAfter(RoundTable):
    """Sets the stop event once `rounds` rounds were logged (as a signal between rounds would)."""

    def __init__(self, rounds: int, event: threading.Event):
        super().__init__("test", quiet=True)
        self.left, self.event = rounds, event

    def add(self, row: dict) -> None:
        super().add(row)
        self.left -= 1
        if self.left == 0:
            self.event.set()


def test_a_stopped_run_checkpoints_its_last_round(tmp_path):
    cfg = tiny_cfg("run.checkpoint_every=50")
    event = threading.Event()
    node = Node(cfg, tmp_path)
    node.run(100, StopAfter(3, event), event)
    assert [r["round"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    assert checkpoint_round(tmp_path) == 2  # periodic checkpoints alone would have none yet
    resumed = Node(cfg, tmp_path)
    assert resumed.resume() == 2 and resumed.next_round == 3


JOIN = ["join", "--preset", "tiny", "--rounds", "100000", "--quiet", "--listen", "/ip4/127.0.0.1/tcp/0",
        "--set", "swarm.min_round_s=0.2", "--set", "run.checkpoint_every=1000", "--set", "run.threads=1",
        "--swarm", "stoptest"]


def start_join(popen, run_dir: Path, log: Path) -> subprocess.Popen:
    with log.open("ab") as out:
        return popen([sys.executable, "-m", "node.cli", *JOIN, "--run-dir", str(run_dir)], cwd=ROOT,
                     env=repo_env(), stdout=out, stderr=out)


@pytest.mark.slow
def test_sigterm_stops_a_joined_node_after_a_checkpoint_and_it_resumes_there(tmp_path, processes):
    run_dir, log = tmp_path / "node", tmp_path / "node.log"
    proc = start_join(processes, run_dir, log)
    wait_until(lambda: len(read_metrics(run_dir)) >= 4, "4 rounds", procs=[proc], timeout=120, step=0.25)
    assert checkpoint_round(run_dir) is None  # every 1000 rounds: nothing periodic yet
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log.read_text()[-2000:]
    last = read_metrics(run_dir)[-1]["round"]
    assert checkpoint_round(run_dir) == last, log.read_text()[-2000:]
    assert "stopped by signal after round" in log.read_text()

    proc = start_join(processes, run_dir, log)  # a restart (systemd, docker) continues after that round
    wait_until(lambda: read_metrics(run_dir)[-1]["round"] > last + 1, "the restarted node's rounds", procs=[proc],
               timeout=120, step=0.25)
    stop([proc])  # before its log and rounds are read
    assert f"resumed from the checkpoint of round {last}" in log.read_text()
    rounds = [r["round"] for r in read_metrics(run_dir)]
    assert rounds == list(range(len(rounds)))  # nothing lost, nothing repeated
