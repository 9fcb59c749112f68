"""The p2pd peer cache (protocol/transports/p2pd/peer_cache.py) on a fake clock: ranking by usefulness,
eviction of dead and silent entries, the per-address-group, dead-per-group and never-useful bounds,
and the Dialer's rank order and bounded redials (issue 16: departed attacker hosts filled peers.json;
then a wave of them, each useful or answering once, held an address group's slots for an hour)."""
from __future__ import annotations

import json
from collections import Counter

from protocol.transports.p2pd.addrs import peer_id_bytes
from protocol.transports.p2pd.control import ControlError
from protocol.transports.p2pd.discovery import Dialer
from protocol.netgroups import network_group as address_group
from protocol.transports.p2pd.peer_cache import PeerCache, PeerCacheLimits

from tests.support.fake_clock import FakeClock

HOUR = 3600.0


def addr(i: int, net: str = "10.0") -> str:
    return f"/ip4/{net}.{i // 250}.{i % 250 + 1}/tcp/4001"


def make(tmp_path, **limits) -> tuple[PeerCache, FakeClock]:
    clock = FakeClock(1_000_000.0)
    return PeerCache(tmp_path / "peers.json", PeerCacheLimits(**limits), clock=clock), clock


def dead_per_group(cache: PeerCache) -> Counter:
    """address group -> dead entries (failed `max_dial_failures` dials in a row) it holds."""
    lim = cache.limits
    return Counter(g for rec in cache.load().values() if rec.failures >= lim.max_dial_failures
                   for g in {address_group(a, lim.ipv4_prefix, lim.ipv6_prefix) for a in rec.addrs})


def test_address_groups_are_ipv4_16_and_ipv6_32_and_configurable():
    assert address_group("/ip4/10.1.2.3/tcp/1") == address_group("/ip4/10.1.200.9/tcp/2") == "ip4:10.1.0.0/16"
    assert address_group("/ip4/10.2.2.3/tcp/1") != address_group("/ip4/10.1.2.3/tcp/1")
    assert address_group("/ip6/2001:db8:1::5/tcp/1") == address_group("/ip6/2001:db8:ffff::1/tcp/1")
    assert address_group("/ip4/127.0.0.1/tcp/1", ipv4_prefix=32) == "ip4:127.0.0.1/32"
    assert address_group("/dns4/example.org/tcp/1") == "dns4:example.org"
    assert address_group("garbage") == ""  # unknown (protocol/netgroups.py)


def test_useful_peers_rank_first_then_answering_then_recent(tmp_path):
    cache, clock = make(tmp_path)
    cache.remember({"useful": [addr(1)], "answering": [addr(2)]})
    clock.advance(10)
    cache.remember({"recent": [addr(3)]})  # seen most recently, but never proved anything
    cache.record_dial("answering", answered=True)
    cache.note_useful(["useful"])
    assert list(cache.load()) == ["useful", "answering", "recent"]
    assert list(cache.dial_targets()) == ["useful", "answering", "recent"]
    cache.save()
    assert list(json.loads((tmp_path / "peers.json").read_text())["peers"]) == ["useful", "answering", "recent"]


def test_a_useful_mark_before_the_peer_is_cached_applies_when_it_connects(tmp_path):
    cache, clock = make(tmp_path)
    cache.note_useful(["later"])
    clock.advance(5)
    cache.remember({"other": [addr(1)], "later": [addr(2)]})
    assert list(cache.load()) == ["later", "other"] and cache.load()["later"].useful > 0


def test_never_useful_entries_are_bounded_whatever_their_number(tmp_path):
    cache, clock = make(tmp_path, max_unproven=4, max_per_group=100)
    cache.remember({"honest": [addr(0)]})
    cache.note_useful(["honest"])
    for i in range(1, 60):  # hosts that connect once and leave, each more recent than the last
        clock.advance(1)
        cache.remember({f"sybil{i}": [addr(i)]})
    kept = cache.load()
    assert list(kept)[0] == "honest"
    assert len(kept) == 1 + 4 and set(list(kept)[1:]) == {f"sybil{i}" for i in range(56, 60)}


def test_one_address_group_holds_at_most_its_bound(tmp_path):
    cache, clock = make(tmp_path, max_per_group=3, max_unproven=100)
    for i in range(10):
        clock.advance(1)
        cache.remember({f"same16_{i}": [addr(i, "10.7")]})  # all in 10.7.0.0/16
    cache.remember({"elsewhere": [addr(1, "192.168")]})
    kept = cache.load()
    assert {p for p in kept if p.startswith("same16_")} == {"same16_7", "same16_8", "same16_9"}  # most recent
    assert "elsewhere" in kept
    cache.note_useful(["worker"])  # a peer whose groups we use outranks them in its group
    cache.remember({"worker": [addr(20, "10.7")]})
    assert {p for p in cache.load() if p.startswith(("same16_", "worker"))} == {"worker", "same16_8", "same16_9"}
    # an entry counts in every group it names: a full group keeps it out whatever else it names
    clock.advance(-100)  # ranked below everyone in 10.7.0.0/16
    cache.remember({"spread": [addr(1, "172.16"), addr(1, "10.7")]})
    assert "spread" not in cache.load()


def test_dead_entries_go_after_max_failures_and_proven_ones_only_after_a_grace(tmp_path):
    cache, clock = make(tmp_path, max_dial_failures=3, proven_grace_s=HOUR)
    cache.remember({"unproven": [addr(1)], "proven": [addr(2)]})
    cache.note_useful(["proven"])
    for _ in range(3):
        clock.advance(1)
        cache.record_dial("unproven", answered=False)
        cache.record_dial("proven", answered=False)
    assert list(cache.load()) == ["proven"]  # the unproven one is gone after 3 failures in a row
    clock.advance(HOUR)
    cache.record_dial("proven", answered=False)
    assert cache.load() == {}  # failing and silent for over the grace: gone too


def test_an_answer_or_a_connection_resets_the_failure_count(tmp_path):
    cache, clock = make(tmp_path, max_dial_failures=3)
    cache.remember({"flaky": [addr(1)]})
    for outcome in (False, False, True, False, False):
        cache.record_dial("flaky", answered=outcome)
    cache.remember({"flaky": [addr(1)]})
    cache.record_dial("flaky", answered=False)
    cache.record_dial("flaky", answered=False)
    assert cache.load()["flaky"].failures == 2


def test_entries_silent_longer_than_max_age_are_evicted(tmp_path):
    cache, clock = make(tmp_path, max_age_s=100.0)
    cache.remember({"old": [addr(1)]})
    clock.advance(60)
    cache.remember({"new": [addr(2)]})
    clock.advance(50)
    cache.remember({"newest": [addr(3)]})
    assert set(cache.load()) == {"new", "newest"}


def test_the_file_is_read_once_rewritten_only_when_changed_and_survives_a_restart(tmp_path):
    cache, clock = make(tmp_path)
    cache.remember({"a": [addr(1)], "b": [addr(2)]})
    cache.note_useful(["b"])
    assert cache.save() and not cache.save()  # nothing new: no rewrite
    again = PeerCache(tmp_path / "peers.json", clock=clock)
    assert list(again.load()) == ["b", "a"] and again.load()["b"].useful == clock.now
    (tmp_path / "peers.json").write_text(json.dumps({"peers": {"x": {"addrs": [addr(1)], "seen": "soon"}}}))
    assert PeerCache(tmp_path / "peers.json", clock=clock).load() == {}  # corrupt: an empty cache


class FakeControl:
    """Stands in for the daemon's control socket: records CONNECT requests, fails the dead ones."""

    def __init__(self, alive: set[bytes]) -> None:
        self.alive = alive
        self.dialed: list[bytes] = []

    def request(self, request):
        self.dialed.append(request.connect.peer)
        if request.connect.peer not in self.alive:
            raise ControlError("dial failed: connection refused")


def test_the_dialer_dials_in_rank_order_and_gives_up_on_dead_cached_peers(tmp_path, monkeypatch, identity):
    import protocol.transports.p2pd.discovery as discovery

    ids = [identity().peer_id() for _ in range(6)]
    honest, dead, bootstrap, own = ids[0], ids[1:4], ids[4], ids[5]
    cache, clock = make(tmp_path, max_dial_failures=3)
    cache.remember({pid: [addr(i)] for i, pid in enumerate(dead)})
    clock.advance(1)
    cache.remember({honest: [addr(9)]})
    cache.note_useful([honest])
    clock.advance(1)
    cache.remember({dead[0]: [addr(0)]})  # the most recently seen, yet ranked below the useful one
    cache.record_dial(dead[2], answered=True)  # it answered once: the cache keeps it through an outage
    control = FakeControl({peer_id_bytes(honest)})
    dialer = Dialer(own, {bootstrap: [f"{addr(20)}/p2p/{bootstrap}"]}, cache, control_timeout_s=2.0,
                    backoff_initial_s=0.0, backoff_max_s=0.0, max_cached_failures=3)
    counts: dict[str, int] = {}
    monotonic = FakeClock()
    monkeypatch.setattr(discovery.time, "monotonic", monotonic)
    for _ in range(10):  # ten passes with no backoff left: every dead peer would be dialed ten times
        dialer.dial_missing(control, connected=set(), count=lambda k: counts.__setitem__(k, counts.get(k, 0) + 1))
        monotonic.advance(1.0)
    first_pass = [peer_id_bytes(p) for p in (bootstrap, honest, dead[2], dead[0], dead[1])]
    assert control.dialed[:5] == first_pass  # bootstrap, then cached by rank: useful, answered, most recent
    failed_cached = sum(control.dialed.count(peer_id_bytes(p)) for p in dead)
    assert failed_cached == 3 * len(dead)  # bounded: three each, then given up
    assert control.dialed.count(peer_id_bytes(bootstrap)) == 10  # the operator's bootstrap peer: always
    assert counts["dial_given_up"] == len(dead)
    assert list(cache.load()) == [honest, dead[2]]  # the cache evicted the others, kept the one that answered


def test_a_bad_entry_in_the_file_is_skipped_and_times_from_the_future_are_clamped(tmp_path):
    clock = FakeClock(1_000_000.0)
    (tmp_path / "peers.json").write_text(json.dumps({"peers": {
        "future": {"addrs": [addr(1)], "seen": clock.now + 10 * HOUR, "useful": 1e300},
        "torn": {"addrs": "/ip4/10.0.0.9/tcp/1", "seen": clock.now},
        "nan": {"addrs": [addr(2)], "seen": "nan"},
        "infinite": {"addrs": [addr(4)], "seen": clock.now, "failures": float("inf"), "useful_marks": 1},
        "fine": {"addrs": [addr(3)], "seen": clock.now - 5},
    }}))
    kept = PeerCache(tmp_path / "peers.json", clock=clock).load()
    assert set(kept) == {"future", "fine"}
    assert kept["future"].seen == kept["future"].useful == clock.now  # not ranked first forever


def test_a_wave_of_short_lived_hosts_cannot_hold_the_honest_peers_address_group(tmp_path):
    """Issue 16 again: 64 hosts in the honest peer's /16, each connected, useful or answering once,
    then gone (dead after 3 failed dials). The old cache kept 7 of them for an hour, filling 7 of
    the group's 8 slots, and ranked the latest one useful above the honest peer."""
    cache, clock = make(tmp_path)  # the defaults: 8 per group, dead after 3 failures, an hour's grace
    net, honest = "10.1", "honest"
    for _ in range(20):  # the node used the honest peer's groups for 20 rounds before the wave
        clock.advance(10)
        cache.remember({honest: [addr(0, net)]})
        cache.note_useful([honest])
    for i in range(1, 65):
        attacker = f"attacker{i}"
        clock.advance(10)
        cache.remember({honest: [addr(0, net)], attacker: [addr(i, net)]})
        cache.note_useful([honest])  # still useful, every round
        clock.advance(1)
        if i % 2:
            cache.note_useful([attacker])  # after the honest peer's mark: the most recently useful
        else:
            cache.record_dial(attacker, answered=True)
        assert next(iter(cache.dial_targets())) == honest, i  # a node that crashed now dials it first
        for _ in range(3):  # it left: our redials fail
            clock.advance(1)
            cache.record_dial(attacker, answered=False)
        assert max(dead_per_group(cache).values()) <= 4, i
    kept = cache.load()
    assert list(kept)[0] == honest and list(cache.dial_targets())[0] == honest
    assert dead_per_group(cache) == {"ip4:10.1.0.0/16": 4}  # half the group's 8 slots, not 7
    assert set(kept) == {honest, "attacker63", "attacker61", "attacker59", "attacker57"}  # the best dead
    cache.save()
    assert next(iter(json.loads((tmp_path / "peers.json").read_text())["peers"])) == honest


def test_an_address_group_holds_at_most_half_its_slots_of_dead_entries(tmp_path):
    cache, clock = make(tmp_path, max_per_group=8, max_dial_failures=3)
    proven = [f"proven{i}" for i in range(8)]
    for i, pid in enumerate(proven):
        clock.advance(1)
        cache.remember({pid: [addr(i)]})
        cache.note_useful([pid])
    cache.note_useful(["proven0"])  # used in a second round: the best of them
    for _ in range(2):  # a short outage: two failed dials each, none dead yet
        for pid in proven:
            cache.record_dial(pid, answered=False)
    assert set(cache.load()) == set(proven)
    for pid in proven[1:]:  # the third failure: dead, all but proven0
        cache.record_dial(pid, answered=False)
    assert set(cache.load()) == {"proven0", "proven7", "proven6", "proven5", "proven4"}  # 4 dead: the best
    cache.record_dial("proven0", answered=False)  # dead too, and the best-ranked dead one
    assert set(cache.load()) == {"proven0", "proven7", "proven6", "proven5"}  # still 4 dead: proven4 goes
    cache.remember({f"live{i}": [addr(20 + i)] for i in range(4)})  # the group's other 4 slots
    assert len(cache.load()) == 8 and dead_per_group(cache) == {"ip4:10.0.0.0/16": 4}
    cache.remember({"another": [addr(30)]})  # live: it outranks every dead one, and the worst goes
    assert "another" in cache.load() and "proven5" not in cache.load() and len(cache.load()) == 8
    assert dead_per_group(cache) == {"ip4:10.0.0.0/16": 3}
    # half the group's slots, rounded down, and at least one: a lone proven peer survives an outage
    assert [PeerCacheLimits(max_per_group=n).dead_per_group for n in (1, 2, 3, 8, 9)] == [1, 1, 1, 4, 4]

def test_a_dead_peer_ranks_below_live_ones_whatever_it_did(tmp_path):
    cache, clock = make(tmp_path, max_dial_failures=3)
    cache.remember({"was_useful": [addr(1)], "answering": [addr(2)]})
    clock.advance(1)
    cache.remember({"recent": [addr(3, "10.9")]})
    for _ in range(5):
        cache.note_useful(["was_useful"])
    cache.record_dial("answering", answered=True)
    for _ in range(2):
        cache.record_dial("was_useful", answered=False)
    assert list(cache.load()) == ["was_useful", "answering", "recent"]  # two failures: an outage, still first
    cache.record_dial("was_useful", answered=False)
    assert list(cache.dial_targets()) == ["answering", "recent", "was_useful"]  # dead: kept, dialed last
    cache.remember({"was_useful": [addr(1)]})  # back
    assert list(cache.load())[0] == "was_useful"


def test_peers_useful_in_more_rounds_rank_first_and_files_without_marks_still_load(tmp_path):
    cache, clock = make(tmp_path)
    cache.note_useful(["pending", "pending"])  # one round, however many of its groups
    cache.note_useful(["pending"])
    cache.remember({"long": [addr(1)], "pending": [addr(2)]})
    for _ in range(3):
        clock.advance(10)
        cache.note_useful(["long"])
    clock.advance(10)
    cache.remember({"once": [addr(3)]})
    cache.note_useful(["once"])  # the most recent mark, but the fewest
    assert [(p, round(r.useful_marks, 3)) for p, r in cache.load().items()] == [("long", 3), ("pending", 2), ("once", 1)]
    cache.save()
    assert PeerCache(tmp_path / "peers.json", clock=clock).load() == cache.load()
    old = {"used": {"addrs": [addr(1)], "seen": clock.now, "useful": clock.now - 5},
           "never": {"addrs": [addr(2)], "seen": clock.now}}  # written before `useful_marks`
    (tmp_path / "peers.json").write_text(json.dumps({"peers": old}))
    assert {p: r.useful_marks for p, r in PeerCache(tmp_path / "peers.json", clock=clock).load().items()} \
        == {"used": 1, "never": 0}


def test_the_dialer_redials_a_kept_peer_whatever_the_budget(tmp_path, identity):
    """A node at `conn_low` or more dials nobody (dial budget 0), so a kept peer (its groups used)
    whose connection dropped under a flood was not redialed until the flood ended."""
    ids = [identity().peer_id() for _ in range(3)]
    honest, other, own = ids
    cache, _ = make(tmp_path)
    cache.remember({honest: [addr(1)], other: [addr(2)]})
    control = FakeControl({peer_id_bytes(honest), peer_id_bytes(other)})
    dialer = Dialer(own, {}, cache, control_timeout_s=2.0, backoff_initial_s=0.0, backoff_max_s=0.0)
    assert dialer.dial_missing(control, connected=set(), count=lambda k: None, budget=0) == 0
    assert dialer.dial_missing(control, connected=set(), count=lambda k: None, budget=0,
                               must=frozenset({honest})) == 1
    assert control.dialed == [peer_id_bytes(honest)]


def test_usefulness_marks_halve_every_half_life_so_an_old_favourite_yields_to_todays_peer(tmp_path):
    """Issue 42: marks never decayed, so a host useful for hours once (an attacker's while it was
    established) outranked every peer useful later, for good."""
    cache, clock = make(tmp_path, useful_half_life_s=HOUR)
    cache.remember({"old": [addr(1)], "today": [addr(2, "10.1")]})
    for _ in range(16):  # 16 rounds of use, then silence
        clock.advance(1)
        cache.note_useful(["old"])
    clock.advance(5 * HOUR)  # 16 marks halved five times: 0.5
    for _ in range(2):
        clock.advance(1)
        cache.note_useful(["today"])
    marks = {p: r.marks_at(clock.now, HOUR) for p, r in cache.load().items()}
    assert abs(marks["old"] - 0.5) < 0.01 and abs(marks["today"] - 2.0) < 0.01
    assert list(cache.load()) == ["today", "old"]
    cache.note_useful(["old"])  # a new mark adds to the decayed ones, not to the old count
    assert abs(cache.load()["old"].useful_marks - 1.5) < 0.01
