"""Structured logs (run.log_level, run.log_format; node/observe/logs.py): real `swarm-node` processes in
JSON mode print only JSON lines with the events an operator greps for, and a peer's malformed
message, its ban and a p2pd daemon restart are logged with their fields, rate-limited where a peer
could flood the log."""
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.observe.logs import JsonFormatter, TextFormatter, configure, node_log
from node.observe.metrics import RoundTable
from node.observe.tensorboard import TB_DIR, read_scalars
from protocol import Ingress, MemoryBus, MemoryTransport, P2pdOptions, topic_name
from protocol.logthrottle import LogThrottle, short_id
from protocol.testing import seal_message

from tests.support.fake_clock import FakeClock
from tests.support.processes import repo_env
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "node.cli"]
ENV = repo_env()


def json_lines(text: str) -> list[dict]:
    """Every non-empty line as JSON (fails on the first that is not) with the four fixed keys."""
    records = []
    for line in text.splitlines():
        if not line.strip():
            continue
        record = json.loads(line)  # strict: a NaN or Infinity literal would fail jq too
        assert {"ts", "level", "logger", "msg"} <= set(record), line
        assert record["level"] in ("debug", "info", "warning", "error", "critical"), line
        records.append(record)
    return records


def events(records: list[dict], name: str) -> list[dict]:
    return [r for r in records if r.get("event") == name]


@pytest.mark.slow
def test_train_in_json_mode_prints_only_json_with_round_checkpoint_and_resume_events(tmp_path):
    args = [*CLI, "train", "--preset", "tiny", "--run-dir", str(tmp_path), "--set", "run.threads=1",
            "--set", "run.checkpoint_every=2", "--set", "eval.every=2", "--set", "eval.tasks_per_family=2"]
    first = subprocess.run([*args, "--rounds", "4", "--set", "run.log_format=json"], cwd=ROOT, env=ENV,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout == ""
    records = json_lines(first.stderr)
    rounds = events(records, "round")
    assert [r["round"] for r in rounds] == [0, 1, 2, 3] and all(r["level"] == "info" for r in rounds)
    assert all(isinstance(r["reward_mean"], float) and "pass_rate" in r for r in rounds)
    assert [r["heldout_pass1"] is not None for r in rounds if "heldout_pass1" in r] == [True, True]
    checkpoints = events(records, "checkpoint")
    assert [c["round"] for c in checkpoints] == [1, 3]
    assert all(Path(c["path"]).is_dir() and c["level"] == "info" for c in checkpoints)
    assert events(records, "start")[0]["next_round"] == 0
    assert events(records, "summary")[0]["rounds"] == 4

    # the environment sets it like any key; a resumed run says where it resumed
    resumed = subprocess.run([*args, "--rounds", "5", "--resume"], cwd=ROOT, capture_output=True, text=True,
                             env={**ENV, "SWARM_NODE_RUN__LOG_FORMAT": "json", "SWARM_NODE_RUN__LOG_LEVEL": "debug"},
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = json_lines(resumed.stderr)
    (resume,) = events(records, "resume")
    assert resume["round"] == 3 and resume["next_round"] == 4 and resume["checkpoint"].endswith("round-000003")
    assert [r["round"] for r in events(records, "round")] == [4]

    quiet = subprocess.run([*args, "--rounds", "6", "--resume", "--set", "run.log_format=json",
                            "--set", "run.log_level=warning"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=300)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert all(r["level"] in ("warning", "error") for r in json_lines(quiet.stderr))


@pytest.mark.slow
def test_join_in_json_mode_prints_only_json_and_writes_tensorboard(tmp_path, processes):
    """A real `join` over the p2pd transport (its daemon, threads and libraries included)."""
    log_file = tmp_path / "node.log"
    cmd = [*CLI, "join", "--preset", "tiny", "--quiet", "--run-dir", str(tmp_path / "node"), "--listen",
           "/ip4/127.0.0.1/tcp/0", "--swarm", "logs", "--rounds", "3", "--set", "run.threads=1",
           "--set", "run.log_format=json", "--set", "run.tensorboard=true"]
    with log_file.open("wb") as out:
        proc = processes(cmd, cwd=ROOT, env=ENV, stdout=out, stderr=subprocess.STDOUT)
        wait_until(lambda: proc.poll() is not None, "the node to run 3 rounds and exit", timeout=180, step=0.25)
    assert proc.returncode == 0, log_file.read_text()[-3000:]
    records = json_lines(log_file.read_text())
    (joined,) = events(records, "joined")
    assert joined["listen_addrs"] and joined["peer_id"].startswith("12D3")
    assert events(records, "daemon_started")[0]["pid"] > 0
    assert [r["round"] for r in events(records, "round")] == [0, 1, 2]
    assert [c["round"] for c in events(records, "checkpoint")] == [2]
    assert sorted(read_scalars(tmp_path / "node" / TB_DIR)["reward_mean"]) == [0, 1, 2]


def test_a_malformed_message_is_logged_with_its_reason_and_floods_are_held_back(caplog):
    ingress = Ingress()
    clock = FakeClock()
    ingress.log_throttle = LogThrottle(clock=clock)
    flooder, other = "12D3KooWFlooderFlooderFlooderFlooderFlooderAAAA", "12D3KooWOtherOtherOtherOtherOtherOtherBBBB"
    with caplog.at_level(logging.DEBUG, logger="protocol"):
        for _ in range(3):  # three malformed messages: score -9, not banned yet
            assert ingress.accept(flooder, b"\xff\x00not a protobuf") is None
        rejected = [r for r in caplog.records if getattr(r, "event", "") == "message_rejected"]
        assert len(rejected) == 1  # one record per reason and peer a minute
        (record,) = rejected
        assert record.levelno == logging.WARNING and record.reason == "malformed" and record.stage == "ingress"
        assert record.peer == short_id(flooder) == flooder[-8:] and record.peer_id == flooder
        assert record.blamed == [short_id(flooder)] and record.suppressed == 0
        line = json.loads(JsonFormatter().format(record))
        assert (line["level"], line["logger"], line["reason"], line["peer"]) == \
            ("warning", "protocol.ingress", "malformed", short_id(flooder))
        assert "reason=malformed" in TextFormatter().format(record)

        ingress.accept(other, b"\xff\x00junk")  # another peer is not held back by the first one
        assert [r.peer for r in caplog.records if getattr(r, "event", "") == "message_rejected"][-1] == short_id(other)

        caplog.clear()
        ingress.accept(flooder, b"\xff\x00not a protobuf")  # the 4th: score -12 < -10, a ban
        (ban,) = [r for r in caplog.records if getattr(r, "event", "") == "peer_banned"]
        assert ban.levelno == logging.WARNING and ban.peer == short_id(flooder) and ban.cause == "malformed"
        assert ban.ban_s == 60.0 and ban.ban_count == 1
        caplog.clear()
        for _ in range(50):
            ingress.accept(flooder, b"\xff\x00not a protobuf")  # banned now: debug, and held back
        (banned,) = [r for r in caplog.records if getattr(r, "event", "") == "message_rejected"]
        assert banned.reason == "banned" and banned.levelno == logging.DEBUG
        clock.now = 61.0  # a minute later the next record carries the count held back
        caplog.clear()
        ingress.accept(flooder, b"\xff\x00not a protobuf")
    (later,) = [r for r in caplog.records if getattr(r, "event", "") == "message_rejected"]
    assert later.reason == "banned" and later.suppressed == 49
    assert ingress.log_throttle.suppressed == 2 + 1 + 49  # malformed 2nd to 4th, banned 2nd to 50th


def test_throttle_caps_all_keys_together():
    clock = FakeClock()
    throttle = LogThrottle(window_s=60, total=3, clock=clock)
    assert [throttle.allow(i) for i in range(10)] == [0, 0, 0] + [None] * 7  # 1,000 fresh keys: 3 lines
    clock.now = 60.0
    assert throttle.allow(5) == 1 and throttle.allow(0) == 0


def test_a_lying_peer_is_refused_with_its_reason_and_each_round_sums_the_rejections(tmp_path, caplog, tiny_config,
                                                                                    identity):
    """The real exchange of a tiny node: a group whose claimed rewards are false, a garbage message."""
    from node.service.assembly import memory_bus_node
    from tests.unit.peers.test_exchange import honest_group

    bus = MemoryBus()
    cfg = tiny_config("swarm.name=t", "swarm.admission.young_share_max=1.0")
    node = memory_bus_node(cfg, tmp_path, bus, "receiver")
    liar_key = identity()
    liar = honest_group(node, 3)
    liar.verifier_digest = node.verifier.digest
    liar.completions[1].claimed_reward = 1.0 - liar.completions[1].claimed_reward
    sender = MemoryTransport(bus, "liar")
    sender.start()
    sender.publish(topic_name("t", "rollouts"), seal_message(liar_key, liar, 1, int(time.time() * 1000)))
    sender.publish(topic_name("t", "rollouts"), b"\xff\x00garbage")
    with caplog.at_level(logging.INFO, logger="node"):
        node.run(1, RoundTable("t", quiet=True))
    refused = [r for r in caplog.records if getattr(r, "event", "") == "message_rejected"]
    (lie,) = [r for r in refused if r.reason == "wrong_reward"]
    assert lie.levelno == logging.WARNING and lie.stage == "node" and lie.peer == short_id(liar_key.peer_id())
    assert "claimed" in lie.detail
    (summary,) = [r for r in caplog.records if getattr(r, "event", "") == "rejections"]
    assert summary.round == 0 and summary.by_reason == {"malformed": 1, "wrong_reward": 1} and summary.total == 2
    assert json.loads(JsonFormatter().format(summary))["by_reason"] == {"malformed": 1, "wrong_reward": 1}


def test_json_lines_stay_strict_json_and_configure_is_idempotent(capsys):
    configure("debug", "json")
    configure("debug", "json")  # once more: still one handler
    try:
        logging.getLogger("node.test").info("x %s", "y",
                                            extra={"event": "e", "value": math.inf, "nested": {"n": math.nan}})
        logging.getLogger("some.library").info("not shown: other libraries log at warning and up")
    finally:
        configure()
    (line,) = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert (record["msg"], record["event"], record["value"], record["nested"]) == ("x y", "e", "inf", {"n": "nan"})
    with pytest.raises(ValueError, match="log level"):
        configure("verbose", "text")


@pytest.mark.slow
def test_a_p2pd_daemon_restart_is_logged_with_its_fields(caplog, identity):
    from protocol.transports.p2pd import DaemonStartError, P2pdTransport
    from protocol.transports.p2pd.daemon import daemon_binary

    try:
        daemon_binary()
    except DaemonStartError as missing:  # pragma: no cover - setup.sh installs hivemind
        pytest.skip(str(missing))
    transport = P2pdTransport(identity().private_seed(),
                              P2pdOptions(topics=["swarm-node/logs/rollouts/v1"], health_interval_s=0.3))
    with caplog.at_level(logging.INFO, logger="protocol"):
        transport.start()
        try:
            old_pid = transport.stats()["daemon_pid"]
            os.kill(old_pid, signal.SIGKILL)  # a daemon this test started (through the transport)
            wait_until(lambda: transport.stats()["daemon_restarts"] == 1 and transport.stats()["daemon_state"] == 1,
                       "the daemon restart", timeout=20, step=0.25)
        finally:
            transport.close()
    (restart,) = [r for r in caplog.records if getattr(r, "event", "") == "daemon_restart"]
    assert restart.levelno == logging.ERROR and restart.pid == old_pid and restart.restarts == 1
    assert "exited" in restart.reason
    started = [r for r in caplog.records if getattr(r, "event", "") == "daemon_started"]
    assert [s.restarts for s in started] == [0, 1] and started[1].pid != old_pid
    assert json.loads(JsonFormatter().format(restart))["event"] == "daemon_restart"


def test_node_log_keeps_a_nodes_records_in_its_file_and_warnings_on_stderr(tmp_path, capsys):
    """The in-process testnet's nodes log into their run dirs; the live table keeps only warnings."""
    configure("info", "text")
    try:
        with node_log(tmp_path / "node0.log"):
            logging.getLogger("node.train.loop").info("checkpoint of round 9 written", extra={"event": "checkpoint"})
            logging.getLogger("node.peers.exchange").warning("a peer broke something")
        logging.getLogger("node.cli").info("outside any node")
    finally:
        configure()
    err = capsys.readouterr().err
    assert "checkpoint of round 9" not in err and "a peer broke something" in err and "outside any node" in err
    text = (tmp_path / "node0.log").read_text()
    assert "checkpoint of round 9 written  event=checkpoint" in text and "a peer broke something" in text
    assert "outside any node" not in text
