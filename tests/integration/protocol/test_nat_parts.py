"""The parts of "joining from behind NAT" that need no NAT: the daemon's flags for AutoNAT and relays
(protocol/transports/p2pd/nat.py), reading its AutoNAT verdict back, which addresses people get to
join with, the swarm.nat configuration, and the relayed-stream protocol (relayed.py) between two
real daemons on 127.0.0.1, hostile streams included. The real NAT is in tests/experiments/test_nat.py."""
from __future__ import annotations

import http.server
import os
import socket
import threading

import pytest

from node.config.schema import ConfigError, load_config
from node.service.network import nat_options
from node.service.reach import join_text, reach_summary
from protocol import NodeIdentity, P2pdOptions
from protocol.transports.options import NatOptions
from protocol.transports.p2pd import P2pdTransport
from protocol.transports.p2pd.control import ControlConnection
from protocol.transports.p2pd.nat import (RELAY_LIMIT_FLAGS, Reach, addr_scope, join_addrs, loopback_listen_ports,
                                          metrics_port, nat_flags, parse_metrics, reach_from_metrics, read_reach)
from protocol.transports.p2pd.relayed import MAX_PER_STREAM, MAX_RELAYED_BYTES, frame, stream_open_request
from protocol.transports.p2pd.control import varint

from tests.support.waiting import wait_until

TOPIC = "swarm-node/test/rollouts/v1"
BOOT = "/ip4/11.0.0.1/tcp/4001/p2p/12D3KooWHFNKq8d2rk2DLfHDKGuEo6hiaTsjLKfGfCHCAorF84AD"
RELAY = "/ip4/11.0.0.9/tcp/4001/p2p/12D3KooWCiH2Fayq6meGe8AV5w8Aawt3CffrSCY9cA8nPdSJQF6e"


# --- daemon flags ---------------------------------------------------------------------------------
def test_default_flags_use_the_bootstrap_peers_as_static_relays_with_fixed_limits():
    flags = nat_flags(NatOptions(), [BOOT])
    assert "-autonat=true" in flags and "-relay=true" in flags and "-relayService=true" in flags
    assert "-metricsAddr=127.0.0.1:0" in flags  # the verdict is read back on loopback only
    assert ["-autoRelay", "-relayDiscovery=false", f"-trustedRelays={BOOT}"] == flags[flags.index("-autoRelay"):][:3]
    assert all(f in flags for f in RELAY_LIMIT_FLAGS) and "-relayDataLimit=131072" in flags
    assert not any(f.startswith("-forceReachability") for f in flags)


def test_flags_follow_each_option():
    assert f"-trustedRelays={RELAY}" in nat_flags(NatOptions(relays=(RELAY,)), [BOOT])  # relays beat bootstrap
    assert "-forceReachabilityPublic" in nat_flags(NatOptions(reachability="public"), [])
    assert "-forceReachabilityPrivate" in nat_flags(NatOptions(reachability="private"), [])
    lone = nat_flags(NatOptions(relay_service=False), [])  # a client with no relay to hold a slot on
    assert "-relay=false" in lone and "-autoRelay" not in lone
    off = nat_flags(NatOptions(relay_client=False, relay_service=False), [BOOT])
    assert "-relay=false" in off and "-relayService=false" in off and "-autoRelay" not in off
    assert not any(f in off for f in RELAY_LIMIT_FLAGS)
    announced = nat_flags(NatOptions(announce=("/ip4/203.0.113.7/tcp/4001",), port_map=True), [])
    assert "-announceAddrs=/ip4/203.0.113.7/tcp/4001" in announced and "-natPortMap=true" in announced
    with pytest.raises(ValueError, match="reachability='maybe'"):
        NatOptions(reachability="maybe")


# --- the daemon's verdict, read back ----------------------------------------------------------------
METRICS = """# HELP libp2p_autonat_reachability_status Current node reachability
# TYPE libp2p_autonat_reachability_status gauge
libp2p_autonat_reachability_status 2
libp2p_autonat_reachability_status_confidence 1
libp2p_autorelay_reservations_opened_total 3
libp2p_autorelay_reservations_closed_total 1
libp2p_relaysvc_status 0
libp2p_relaysvc_reservations_total{type="closed"} 0
garbage line without a value x
"""


def test_metrics_parse_into_a_reach():
    metrics = parse_metrics(METRICS)
    assert metrics["libp2p_autonat_reachability_status"] == 2.0
    assert metrics['libp2p_relaysvc_reservations_total{type="closed"}'] == 0.0
    reach = reach_from_metrics(metrics)
    assert reach == Reach(reachability="private", relay_reservations=2, relay_serving=False, metrics_ok=True)
    assert reach.counters() == {"reachability": 2, "relay_reservations": 2, "relay_serving": 0}
    assert reach_from_metrics({}).reachability == "unknown"  # a daemon without AutoNAT says nothing


def test_the_verdict_is_read_over_loopback_http():
    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = METRICS.replace("status 2", "status 1").encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert read_reach(server.server_address[1], timeout_s=5).reachability == "public"
    finally:
        server.shutdown()
    with pytest.raises(OSError):
        read_reach(server.server_address[1], timeout_s=1)  # nothing listens any more


def test_our_own_loopback_listeners_are_found_in_proc():
    with socket.socket() as listener, socket.socket() as other:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        other.bind(("127.0.0.1", 0))
        other.listen()
        a, b = listener.getsockname()[1], other.getsockname()[1]
        ports = loopback_listen_ports(os.getpid())
        assert {a, b} <= ports
        assert metrics_port(os.getpid(), ports - {a}) == a  # the one listener that is not libp2p's
    assert loopback_listen_ports(2 ** 22 + 7) == set()  # no such process


# --- addresses to join with ---------------------------------------------------------------------------
def test_join_addresses_prefer_what_works_from_outside():
    pid = "/p2p/12D3KooWD9z5xgkNN8YHwSnh2v5NBUELitT7t9yVE2eXXzYwWN3C"
    local = ["/ip4/127.0.0.1/tcp/4001" + pid, "/ip4/10.1.0.2/tcp/4001" + pid, "/ip4/198.18.0.5/tcp/1" + pid]
    relayed = "/ip4/11.0.0.1/tcp/4001/p2p/12D3KooWHFNKq8d2rk2DLfHDKGuEo6hiaTsjLKfGfCHCAorF84AD/p2p-circuit" + pid
    public = "/ip4/11.0.0.2/tcp/4001" + pid
    assert [addr_scope(a) for a in local] == ["local"] * 3
    assert addr_scope(relayed) == "relayed" and addr_scope(public) == "public"
    assert addr_scope("/dns4/relay.example.org/tcp/4001" + pid) == "public"
    assert join_addrs(local + [relayed, public]) == ([public, relayed], True)
    assert join_addrs(local) == (local, False)  # a loopback swarm still gets addresses, flagged local
    text = join_text("12D3KooWX", "main", local, "unknown")
    assert "reachability: unknown" in text and "this host or its LAN only" in text
    assert "LAN only" not in join_text("12D3KooWX", "main", [relayed], "private")


def test_status_says_what_reachability_means():
    assert reach_summary({"connected_peers": 1}) is None  # a transport without AutoNAT
    line = reach_summary({"reachability": 2, "relay_reservations": 1, "relayed_addrs": 1})
    assert line.startswith("reachability private") and "through its relays" in line and "relay slots held 1" in line
    assert "serving as a relay" in reach_summary({"reachability": 1, "relay_serving": 1})


def test_metrics_show_reachability_as_gauges():
    from node.observe.prometheus import _transport

    families = {f.name: f for f in _transport({"reachability": 2, "relayed_peers": 1, "relay_reservations": 2,
                                                "relayed_sent": 9})}
    assert families["swarm_node_transport_reachability"].samples[0].value == 2
    assert families["swarm_node_transport_relayed_peers"].samples[0].value == 1
    events = {s.labels["event"]: s.value for s in families["swarm_node_transport_events"].samples}
    assert events == {"relayed_sent": 9}  # counts stay counts


# --- configuration ----------------------------------------------------------------------------------
def test_swarm_nat_keys_map_onto_nat_options_and_addresses_are_checked():
    import dataclasses

    cfg = load_config("tiny", None, ["swarm.nat.reachability=private", "swarm.nat.port_map=true",
                                     f'swarm.relays=["{RELAY}"]', 'swarm.announce=["/ip4/203.0.113.7/tcp/4001"]'])
    s = cfg.swarm
    assert set(type(s.nat).model_fields) <= {f.name for f in dataclasses.fields(NatOptions)}
    options = nat_options(s)  # node/service/network.py builds it from the section
    assert (options.reachability, options.port_map, options.relays, options.announce) == (
        "private", True, (RELAY,), ("/ip4/203.0.113.7/tcp/4001",))
    with pytest.raises(ConfigError, match="ending in /p2p/<peer-id>"):
        load_config("tiny", None, ['swarm.relays=["/ip4/11.0.0.9/tcp/4001"]'])
    with pytest.raises(ConfigError, match="is not a multiaddr"):
        load_config("tiny", None, ['swarm.announce=["203.0.113.7:4001"]'])
    with pytest.raises(ConfigError, match="reachability"):
        load_config("tiny", None, ["swarm.nat.reachability=sometimes"])


# --- the relayed-stream protocol between two real daemons -------------------------------------------
@pytest.fixture
def pair():
    """A and B on 127.0.0.1, B dialing A (connected directly: the protocol runs the same way)."""
    a = P2pdTransport(NodeIdentity.generate().private_seed(), P2pdOptions(topics=[TOPIC]))
    a.start()
    b = P2pdTransport(NodeIdentity.generate().private_seed(),
                      P2pdOptions(topics=[TOPIC], bootstrap=a.listen_addrs()))
    try:
        b.start()
        wait_until(lambda: a.peer_id in b.peers(), "B to connect to A", 20)
        yield a, b
    finally:
        b.close()
        a.close()


def raw_stream(sender: P2pdTransport, receiver: P2pdTransport, payload: bytes) -> bytes:
    """Opens a relayed-protocol stream from `sender` to `receiver`, writes `payload`, returns the answer."""
    with ControlConnection(sender.daemon.socket_path, 5) as conn:
        conn.request(stream_open_request(receiver.peer_id, 5))
        conn.sock.sendall(payload)
        try:
            return conn.sock.recv(1)
        except OSError:
            return b""


def test_a_batch_arrives_once_acknowledged_and_hostile_streams_are_refused(pair):
    a, b = pair
    relayed = b._relayed
    batch = [(TOPIC, f"group {i}".encode()) for i in range(5)] + [("not/our/topic", b"x")]
    assert relayed._send(a.peer_id, batch, b._shared.generation)  # acknowledged
    got = []
    wait_until(lambda: got.extend(a.drain(TOPIC)) or len(got) >= 5, "the batch", 10)
    assert [g.data for g in got] == [f"group {i}".encode() for i in range(5)]
    assert {g.from_peer for g in got} == {b.peer_id}  # the stream's authenticated peer
    stats = a.stats()
    streamed = lambda stats: stats["relayed_received"] + stats["direct_received"]  # noqa: E731 - (B dialed A directly)
    assert streamed(stats) == 5 and stats["dropped_unsubscribed"] == 1
    assert b.stats()["relayed_sent"] == 6
    # a count of zero, a count over the limit, an oversized frame, a stream that stops mid-frame
    for payload in (varint(0), varint(MAX_PER_STREAM + 1),
                    varint(1) + frame(TOPIC.encode()) + varint(a.options.max_msg_bytes + 1),
                    varint(2) + frame(TOPIC.encode())):
        assert raw_stream(b, a, payload) == b""  # no acknowledgement
    # (the truncated stream ends at its deadline or when its sender gives up, whichever comes first)
    wait_until(lambda: a.stats()["relayed_refused"] + a.stats()["relayed_timed_out"] >= 4,
               "the hostile streams refused", 15)
    assert a.drain(TOPIC) == [] and streamed(a.stats()) == 5


def test_a_flood_on_relayed_streams_is_cut_like_gossip(pair):
    a, b = pair
    relayed = b._relayed
    sent = 0
    for _ in range(12):  # 12 x 32 messages at once: far over a burst of 200 at 80/s
        if not relayed._send(a.peer_id, [(TOPIC, f"flood {sent + i}".encode()) for i in range(32)],
                             b._shared.generation):
            break
        sent += 32
    wait_until(lambda: a.stats()["flooders_cut"] == 1, "B to be cut for flooding", 10)
    assert sent < 12 * 32  # the cut peer's streams are no longer acknowledged
    assert not relayed._send(a.peer_id, [(TOPIC, b"after the cut")], b._shared.generation)
    delivered = len(a.drain(TOPIC))
    assert 200 <= delivered < 12 * 32 and a.stats()["dropped_flooding_origin"] >= 1


def test_only_small_messages_are_queued_for_relayed_peers(pair, monkeypatch):
    _, b = pair
    relayed = b._relayed
    relayed.offer(TOPIC, b"x")  # no relayed-only peer: nothing queued
    assert not relayed.outbound
    monkeypatch.setattr(b._shared, "direct_targets", lambda now: {"12D3KooWaDirectPeer"})
    relayed.offer(TOPIC, b"y" * (MAX_RELAYED_BYTES + 1))  # a direct peer only: gossip carries it
    assert not relayed.outbound and b.stats()["direct_too_big"] == 1 and b.stats()["relayed_too_big"] == 0
    with b._shared.lock:
        b._shared.relayed_peers = {"12D3KooWsomebodyBehindARelay"}
    relayed.offer(TOPIC, b"y" * (MAX_RELAYED_BYTES + 1))  # no relay carries it (128 KiB a connection)
    assert b.stats()["relayed_too_big"] == 1


def test_the_daemon_listens_on_no_new_non_loopback_address(identity):
    """Only the libp2p listener the user configured faces the network; the metrics listener that
    tells us AutoNAT's verdict is on 127.0.0.1, and our relayed-stream handler is a unix socket."""
    t = P2pdTransport(identity().private_seed(), P2pdOptions(listen=["/ip4/0.0.0.0/tcp/0"], topics=[TOPIC]))
    t.start()
    try:
        pid = t.stats()["daemon_pid"]
        libp2p_ports = {int(a.split("/tcp/")[1].split("/")[0]) for a in t.listen_addrs()}
        wait_until(lambda: t._shared.metrics_port is not None, "the metrics port to be found", 15)
        facing = set()
        for table in ("tcp", "tcp6", "udp", "udp6"):
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = [r.split() for r in f.readlines()[1:]]
            inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                      if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
            for r in rows:
                listening = r[3] == "0A" if table.startswith("tcp") else r[3] == "07"
                local_ip = r[1].split(":")[0]
                if listening and r[9] in inodes and local_ip not in ("0100007F", "00000000000000000000000001000000"):
                    facing.add(int(r[1].split(":")[1], 16))
        assert facing == libp2p_ports, f"non-loopback listeners {facing}, configured {libp2p_ports}"
        assert t._shared.metrics_port in loopback_listen_ports(pid)
    finally:
        t.close()


def test_announced_addresses_replace_the_listen_ones_and_the_verdict_is_still_read(identity):
    """swarm.announce: the daemon announces only those (a rented box's public address), the join
    addresses are them, and the metrics port is still found although no announced port is real."""
    announced = "/ip4/11.0.0.7/tcp/4001"
    t = P2pdTransport(identity().private_seed(), P2pdOptions(topics=[TOPIC], nat=NatOptions(announce=(announced,))))
    t.start()
    try:
        wait_until(lambda: t.listen_addrs() == [f"{announced}/p2p/{t.peer_id}"], "only the announced address", 15)
        assert join_addrs(t.listen_addrs()) == ([f"{announced}/p2p/{t.peer_id}"], True)
        wait_until(lambda: t._shared.reach.metrics_ok, "the daemon's metrics to be read", 15)
        assert t.reachability() == "unknown"  # nobody to ask on loopback
    finally:
        t.close()
