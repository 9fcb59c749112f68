"""Admission by diversity, not seniority (node/peers/admission.py, issue 42), on a simulated clock and
simulated addresses: promotions per network group, the bootstrap window's trusted keys, decay."""
from __future__ import annotations

import random
from collections import Counter

from node.config.schema import load_config
from node.peers.pool import GroupPool, PoolEntry
from protocol import MemoryBus
from protocol.netgroups import network_group, peer_group
from tests.unit.peers.test_admission import distinct
from tests.unit.peers.test_admission_state import Peer, receiver
from tests.unit.peers.test_admission_time import Clock, earn, timed_admission


def settle(admission, clock: Clock, round_index: int, seconds: float, per_s: float = 1.0) -> int:
    """Runs rounds at `per_s` a second for `seconds`; returns the next round index."""
    for _ in range(int(seconds * per_s)):
        clock.now += 1.0 / per_s
        round_index += 1
        admission.start_round(round_index)
    return round_index


def test_200_keys_of_one_group_seen_first_do_not_delay_a_newcomer_from_another_group():
    """Before: one promotion a minute, most senior first: the newcomer waited behind all 200 (205
    minutes). Now: one per group per interval, so it is established within young_seconds + 2
    intervals, and the attackers' group holds at most its cap of established keys."""
    clock = Clock()
    admission = timed_admission(clock)
    admission.start_round(0)
    earn(admission, "honest", 0)  # the operator's peer: the bootstrap window closes at once
    attackers = [f"sybil{i}" for i in range(200)]
    for key in attackers:
        earn(admission, key, 0)
        admission.place(key, "203.0.0.0/16")
    round_index = settle(admission, clock, 0, 1.0)
    earn(admission, "newcomer", round_index)
    admission.place("newcomer", "198.51.0.0/16")
    seen_at = clock.now
    while admission.is_young("newcomer") and clock.now - seen_at < 4 * 3600:
        round_index = settle(admission, clock, round_index, 1.0)
    waited = clock.now - seen_at
    assert waited <= admission.young_seconds + 2 * admission.establish_interval_s, waited
    round_index = settle(admission, clock, round_index, 3600)  # an hour later
    established = Counter(admission.keys[key].group for key, _ in admission.established())
    assert established["203.0.0.0/16"] == admission.max_established_per_group
    assert established["198.51.0.0/16"] == 1


def test_64_honest_hosts_in_64_groups_are_established_within_ten_minutes_at_a_new_node():
    """A new node (nobody established) at 2 rounds a second, J = 4, the README defaults: 64 hosts,
    each in its own /16, each offering a fresh trainable group every round. They earn their credits
    in the young slots (one a round, in turn across groups) and are promoted up to 16 a minute.
    Before: one promotion a minute, about an hour for all."""
    clock = Clock()
    swarm = load_config("tiny").swarm
    pool = GroupPool.from_config(swarm.pool, swarm.admission, Counter(), clock)
    admission = pool.admission
    hosts = [f"host{i}" for i in range(64)]
    index, established_at = 0, {}
    round_index = 0
    while len(established_at) < len(hosts) and clock.now - 1_000.0 < 3600:
        clock.now += 0.5
        round_index += 1
        pool.evict(round_index)
        for i, host in enumerate(hosts):
            index += 1
            admission.heard(host)
            pool.add(PoolEntry(distinct(index, host), round_index, pool.now()))
            admission.place(host, f"10.{i}.0.0/16")
        pool.sample(4, "per_sender", random.Random(round_index))
        for host in hosts:
            if host not in established_at and not admission.is_young(host):
                established_at[host] = clock.now - 1_000.0
    last = max(established_at.values())
    print("FIGURES", {"hosts_established": len(established_at), "first_s": min(established_at.values()),
                      "last_s": last})
    assert len(established_at) == 64 and last <= 600.0, (len(established_at), last)


def test_an_attacker_seen_a_second_before_the_operators_peer_does_not_take_the_bootstrap_promotion():
    clock = Clock()
    admission = timed_admission(clock)  # "honest" is the operator's --peers key
    admission.start_round(0)
    earn(admission, "sybil", 0)
    clock.now += 1.0
    admission.start_round(1)
    earn(admission, "honest", 1)
    round_index = settle(admission, clock, 1, 30.0)  # 30 rounds: both earned their credits and rounds
    assert not admission.is_young("honest") and admission.is_young("sybil")
    assert [key for key, _ in admission.established()] == ["honest"]


def test_without_a_trusted_key_the_bootstrap_waits_part_of_young_seconds():
    clock = Clock()
    admission = timed_admission(clock, trusted=frozenset())
    admission.start_round(0)
    earn(admission, "first", 0)
    round_index = settle(admission, clock, 0, 30.0)
    assert admission.is_young("first")  # its credits and rounds alone no longer suffice
    wait = admission.young_seconds * admission.bootstrap_young_fraction
    settle(admission, clock, round_index, wait)
    assert not admission.is_young("first")


def test_an_established_key_that_stops_being_useful_is_young_again():
    clock = Clock()
    admission = timed_admission(clock, establish_decay_s=3600.0)
    admission.start_round(0)
    earn(admission, "honest", 0)
    round_index = settle(admission, clock, 0, 30.0)
    assert not admission.is_young("honest")
    round_index = settle(admission, clock, round_index, 3000.0, per_s=0.1)
    admission.credit("honest", "")  # still useful: the hour restarts
    round_index = settle(admission, clock, round_index, 3000.0, per_s=0.1)
    assert not admission.is_young("honest")
    round_index = settle(admission, clock, round_index, 1000.0, per_s=0.1)  # 4000 s without a credit
    assert admission.is_young("honest") and admission.keys["honest"].credited == 0


def test_groups_and_credit_times_survive_a_restart():
    clock = Clock()
    admission = timed_admission(clock)
    admission.start_round(0)
    earn(admission, "honest", 0)
    admission.place("honest", "198.51.0.0/16")
    settle(admission, clock, 0, 30.0)
    restored = timed_admission(clock)
    restored.load_state_dict(admission.state_dict())
    record = restored.keys["honest"]
    assert record.group == "198.51.0.0/16" and record.last_credited_s == admission.keys["honest"].last_credited_s
    assert not restored.is_young("honest")


def test_network_groups_of_addresses():
    ip4 = network_group("/ip4/203.0.113.7/tcp/4001")
    assert ip4 == network_group("/ip4/203.0.9.9/udp/1/quic-v1") == "ip4:203.0.0.0/16"
    assert network_group("/ip4/203.1.113.7/tcp/4001") == "ip4:203.1.0.0/16"
    assert network_group("/ip6/2001:db8:1::1/tcp/1") == "ip6:2001:db8::/32"
    assert network_group("/ip6/::ffff:203.0.113.7/tcp/1") == ip4  # an IPv4 host is one, however written
    assert network_group("/ip4/1.2.3.4/tcp/1/p2p/12D3KooWRelay/p2p-circuit") == "relay:12D3KooWRelay"
    assert network_group("/dns4/example.org/tcp/1") == "dns4:example.org"  # a name is a group of its own
    assert network_group("garbage") == "" and network_group("/ip4/not-an-ip/tcp/1") == ""
    relayed = "/ip4/1.2.3.4/tcp/1/p2p/12D3KooWRelay/p2p-circuit"
    assert peer_group([relayed, "/ip4/10.1.2.3/tcp/9"]) == "ip4:10.1.0.0/16"  # a direct connection decides
    assert peer_group([relayed]) == "relay:12D3KooWRelay" and peer_group([]) == ""


def test_a_peers_key_is_counted_in_the_network_group_of_its_host(tmp_path):
    """Real exchange on the in-process bus: a bus member with a simulated address is its /16; one
    without is a host of its own; two keys signing through one member share its group."""
    bus = MemoryBus()
    node = receiver(tmp_path, bus)
    placed = Peer(bus, "lab")
    placed.transport.address = "/ip4/198.51.100.7/tcp/4001"
    plain = Peer(bus, "laptop")
    for index, peer in enumerate((placed, plain)):
        peer.send(node, index, solved=False)
    node.exchange.collect(0)
    keys = node.exchange.pool.admission.keys
    assert keys[placed.key].group == "ip4:198.51.0.0/16" and keys[plain.key].group == "host:laptop"
