"""The Transport contract's fairness clause on every backend (protocol/transports/base.py): a sender that
floods a full inbox never evicts another sender's message; it loses its own oldest. Real hosts for
the networked transports: py-libp2p and the go-libp2p daemon on 127.0.0.1."""
from __future__ import annotations

import importlib.util
import os
import time

import pytest

from protocol.identity import NodeIdentity
from protocol.transports.memory import MemoryBus, MemoryTransport
from protocol.transports.options import P2pdOptions
from tests.support.waiting import wait_until

TOPIC = "swarm-node/fairness/rollouts/v1"
INBOX = 16  # the receiver's per-topic inbox
HONEST, FLOOD = 4, 60
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def memory_hosts(made: list) -> tuple:
    bus = MemoryBus()
    hosts = (MemoryTransport(bus, "receiver", inbox_capacity=INBOX), MemoryTransport(bus, "honest"),
             MemoryTransport(bus, "flooder"))
    for host in hosts:
        made.append(host)
        host.subscribe(TOPIC)
        host.start()
    return hosts


def libp2p_hosts(made: list) -> tuple:
    if importlib.util.find_spec("libp2p") is None:
        pytest.skip("py-libp2p is not installed")
    from protocol.transports.libp2p import Libp2pOptions, Libp2pTransport

    def make(**kwargs) -> Libp2pTransport:
        host = Libp2pTransport(os.urandom(32), Libp2pOptions(topics=[TOPIC], start_timeout=10.0, **kwargs))
        made.append(host)
        host.start()
        return host

    receiver = make(inbox_size=INBOX)
    return receiver, make(bootstrap=receiver.listen_addrs()), make(bootstrap=receiver.listen_addrs())


def p2pd_hosts(made: list) -> tuple:
    from protocol.transports.p2pd import DaemonStartError, P2pdTransport
    from protocol.transports.p2pd.daemon import daemon_binary

    try:
        daemon_binary()
    except DaemonStartError as missing:  # setup.sh installs hivemind
        pytest.skip(str(missing))

    def make(bootstrap=(), **kwargs) -> P2pdTransport:
        host = P2pdTransport(NodeIdentity.generate().private_seed(),
                             P2pdOptions(listen=LOOPBACK, bootstrap=list(bootstrap), topics=[TOPIC], **kwargs))
        made.append(host)
        host.start()
        return host

    receiver = make(inbox_size=INBOX)
    return receiver, make(receiver.listen_addrs()), make(receiver.listen_addrs())


@pytest.fixture(params=[pytest.param(memory_hosts, id="memory"),
                        pytest.param(libp2p_hosts, id="libp2p", marks=[pytest.mark.slow, pytest.mark.serial]),
                        pytest.param(p2pd_hosts, id="p2pd", marks=[pytest.mark.slow, pytest.mark.serial])])
def hosts(request):
    """(receiver, honest, flooder), every one closed at the end; the receiver's inbox holds INBOX."""
    made: list = []
    try:
        yield request.param(made)
    finally:
        for host in made:
            host.close()


def linked(receiver, sender) -> None:
    """Waits until `sender`'s messages reach `receiver` (GossipSub loses what is published before the
    subscriptions have crossed), then empties the receiver's inbox of the probes."""
    def probe_arrived() -> bool:
        sender.publish(TOPIC, b"probe")
        time.sleep(0.2)
        return any(m.from_peer == sender.peer_id for m in receiver.drain(TOPIC))

    wait_until(probe_arrived, f"{sender.peer_id[-6:]} to reach the receiver")


def received(receiver) -> int:
    return receiver.stats().get("received", 0)


def settled(receiver, expected: int, quiet_s: float = 1.0, timeout: float = 15.0) -> int:
    """How many messages the receiver got once all `expected` arrived or none came for `quiet_s`
    (the daemon may lose a few of a burst on a busy machine: protocol/transports/p2pd/writer.py)."""
    deadline, last, since = time.monotonic() + timeout, -1, time.monotonic()
    while time.monotonic() < deadline:
        now = received(receiver)
        if now >= expected or time.monotonic() - since >= quiet_s:
            return now
        if now != last:
            last, since = now, time.monotonic()
        time.sleep(0.05)
    return received(receiver)


def test_a_flooder_never_evicts_another_senders_message_from_a_full_inbox(hosts):
    receiver, honest, flooder = hosts
    for sender in (honest, flooder):
        linked(receiver, sender)
    time.sleep(0.3)  # late probes
    receiver.drain(TOPIC)
    base = received(receiver)
    for i in range(HONEST):  # first in: a drop-oldest inbox would evict exactly these
        honest.publish(TOPIC, b"honest-%d" % i)
    wait_until(lambda: received(receiver) >= base + HONEST, "the honest messages to arrive")
    for i in range(FLOOD):
        flooder.publish(TOPIC, b"flood-%d" % i)
    honest.publish(TOPIC, b"honest-late")  # and one while the inbox is full
    arrived = settled(receiver, base + HONEST + FLOOD + 1) - base
    assert arrived > INBOX + HONEST + 1, f"only {arrived} messages arrived: the inbox never overflowed"

    got = receiver.drain(TOPIC)
    honest_got = sorted(m.data for m in got if m.from_peer == honest.peer_id)
    assert honest_got == sorted([b"honest-%d" % i for i in range(HONEST)] + [b"honest-late"])
    assert len(got) == INBOX and receiver.stats()["dropped_inbound_full"] == arrived - INBOX
    assert receiver.dropped_by_sender() == {flooder.peer_id: arrived - INBOX}  # the flooder paid for all of it
