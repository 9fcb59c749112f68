"""Application-level network faults (protocol/transports/impairment.py) over the in-process bus."""
from __future__ import annotations

import os
import time

import pytest

from protocol import MemoryBus, MemoryTransport
from protocol.transports.impairment import ImpairedTransport, Impairment, parse_netem, write_impairment

TOPIC = "swarm-node/t/rollouts/v1"


def pair(tmp_path):
    bus = MemoryBus()
    a, b = MemoryTransport(bus, "a"), MemoryTransport(bus, "b")
    c = MemoryTransport(bus, "c")
    impaired = ImpairedTransport(b, tmp_path / "faults.json", seed=1)
    for t in (a, impaired, c):
        t.start()
        t.subscribe(TOPIC)
    return a, impaired, c


def test_netem_spec():
    assert parse_netem("delay 50ms loss 1%") == Impairment(delay_s=0.05, loss=0.01)
    assert parse_netem("loss 0.5% delay 1s 200ms") == Impairment(delay_s=1.0, jitter_s=0.2, loss=0.005)
    with pytest.raises(ValueError, match="netem"):
        parse_netem("rate 1mbit")


def test_partition_delay_and_loss_follow_the_control_file(tmp_path):
    a, b, c = pair(tmp_path)
    a.publish(TOPIC, b"1")
    assert [r.data for r in b.drain(TOPIC)] == [b"1"]  # no file: no fault

    write_impairment(tmp_path / "faults.json", Impairment(blocked=frozenset({"a"})))
    a.publish(TOPIC, b"2")
    c.publish(TOPIC, b"3")
    assert [r.data for r in b.drain(TOPIC)] == [b"3"]  # a is on the other side of the partition
    assert b.stats()["impaired_blocked"] == 1

    write_impairment(tmp_path / "faults.json", Impairment(delay_s=0.3))
    os.utime(tmp_path / "faults.json", (time.time() + 1, time.time() + 1))  # mtime must change
    a.publish(TOPIC, b"4")
    assert b.drain(TOPIC) == []  # healed, but delayed
    time.sleep(0.35)
    assert [r.data for r in b.drain(TOPIC)] == [b"4"]

    write_impairment(tmp_path / "faults.json", Impairment(loss=1.0))
    os.utime(tmp_path / "faults.json", (time.time() + 2, time.time() + 2))
    for i in range(20):
        a.publish(TOPIC, b"x")
    assert b.drain(TOPIC) == [] and b.stats()["impaired_lost"] == 20


def test_a_broken_control_file_keeps_the_last_good_impairment(tmp_path):
    a, b, _ = pair(tmp_path)
    write_impairment(tmp_path / "faults.json", Impairment(blocked=frozenset({"a"})))
    b.drain(TOPIC)
    (tmp_path / "faults.json").write_text("{not json")
    os.utime(tmp_path / "faults.json", (time.time() + 1, time.time() + 1))
    a.publish(TOPIC, b"1")
    assert b.drain(TOPIC) == [] and b.impairment.blocked == {"a"}
