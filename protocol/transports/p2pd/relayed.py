"""Our messages on streams of their own: to peers we reach only through a relay, and to direct peers.

GossipSub in the bundled daemon ignores relayed connections: the relay's limits (nat.py) make
them "transient", and go-libp2p-pubsub skips transient connections (measured here: two nodes
behind NAT, connected through a relay, had 0 topic peers in each other). Streams do run over them
(the daemon opens them with network.WithUseTransient). So a node sends each message it publishes
itself, once, on a stream of protocol RELAYED_PROTOCOL to every peer it is connected to through a
relay only (none once hole punching gave a direct connection), and delivers what such a stream
brings into the same inbox as gossip:

The same streams carry our messages to our *direct peers*: the `direct_peers` (4) most recently
useful peers (the node trains on their groups: shared.py `direct_targets`) that we are connected to
directly. They get each message by gossip too; the stream is what a flood cannot take away. The
daemons' fixed 32-slot GossipSub queues drop honest messages along with a spread flood (32 keys
each under the flood cut): two established peers under such a flood lost a third of each other's
messages in the daemons and went up to 12 s without one. A stream is acknowledged and retried, and
the receiver keeps one copy of a message that both paths brought (dedup.py). GossipSub v1.1 calls
these direct peers; the bundled daemon has no option for them.

* the sender is the stream's remote peer, authenticated by the connection's handshake: only our
  own messages go out (nothing is forwarded), so a relay carries each message at most once per
  relayed peer and can never be made to amplify one;
* inbound, each message passes the flood guard under that peer (a flooder is cut and disconnected,
  as on gossip), the size limit and the topic check, then the inbox's fairness, and the node
  verifies it like any gossip message;
* a stream carries a varint count n <= MAX_PER_STREAM (what queued up since the last stream) and n
  messages, each two frames (topic, then payload; a frame is a varint length and bytes); the
  receiver answers a one-byte ACK and the sender closes only then: a message counts as sent once
  acknowledged. (Closing right after writing lost about 1 message in 15 here: the daemon closes and
  then resets the libp2p stream as soon as its client's socket ends, which can drop bytes still in
  flight through the relay; a half-close ends the stream the same way.)
* each inbound stream has one deadline for the whole of it (time + bytes / minimum rate), at most
  `relayed_streams` are read at once, each on a thread of its own, at most
  `relayed_streams_per_sender` from one sender, and a newcomer displaces the heaviest sender's
  oldest stream instead of being refused (stream_bounds.py): peers trickling bytes on many
  streams cannot keep an honest one out. Cut streams are counted, never acknowledged.
"""
from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import multiaddr

from .addrs import peer_id_bytes, peer_id_text
from .control import ControlConnection, ControlError, varint
from .dedup import STREAM
from .shared import TAKEN_CUT, TAKEN_IN, Shared
from .stream_bounds import StreamDeadline, StreamTable, TableEntry
from proto import p2pd_control_pb2 as pb

log = logging.getLogger(__name__)

RELAYED_PROTOCOL = "/swarm-node/relayed/1.0.0"
MAX_TOPIC_BYTES = 256
MAX_PER_STREAM = 64
ACK = b"\x06"
OUTBOUND_MAX = 256  # own messages waiting for relayed peers; beyond it the oldest is dropped (counted)
SEND_TRIES = 4
RETRY_BACKOFF_S = 0.25  # doubling between tries: 0.25, 0.5, 1 s
BATCH_BYTES = 32 * 1024  # payload bytes per stream at most (one message may exceed it)
MAX_RELAYED_BYTES = 120 * 1024  # a relay resets a connection after 128 KiB (nat.py): bigger never crosses
REFUSED_RETRY_S = 60.0  # a peer that refused the protocol (an old node, a relay) is tried again after this


def relayed_only(peers) -> set[str]:
    """Of a LIST_PEERS answer's PeerInfos, the peers whose every connection to us runs through a
    relay (LIST_PEERS names one address per connection: a /p2p-circuit one is relayed)."""
    relayed, direct = set(), set()
    for info in peers:
        circuit = any(_is_circuit(bytes(a)) for a in info.addrs)
        (relayed if circuit else direct).add(peer_id_text(info.id))
    return relayed - direct


def _is_circuit(raw: bytes) -> bool:
    try:
        return "/p2p-circuit" in str(multiaddr.Multiaddr(raw))
    except Exception:  # noqa: BLE001 - an undecodable address is not a relayed one
        return False


UNIX_CODE = b"\x90\x03"  # multiaddr protocol 400 (/unix) as a varint


def unix_multiaddr_bytes(path: Path) -> bytes:
    """/unix/<absolute path> as the daemon reads it: go-multiaddr keeps the path's leading slash,
    which py-multiaddr's encoder drops (the daemon then dials a relative path and never reaches us)."""
    raw = str(Path(path).resolve()).encode()
    return UNIX_CODE + varint(len(raw)) + raw


def stream_handler_request(socket_path: Path) -> pb.Request:
    addr = unix_multiaddr_bytes(socket_path)
    return pb.Request(type=pb.Request.STREAM_HANDLER,
                      streamHandler=pb.StreamHandlerRequest(addr=addr, proto=[RELAYED_PROTOCOL], balanced=False))


def stream_open_request(peer_id: str, timeout_s: float) -> pb.Request:
    return pb.Request(type=pb.Request.STREAM_OPEN, streamOpen=pb.StreamOpenRequest(
        peer=peer_id_bytes(peer_id), proto=[RELAYED_PROTOCOL], timeout=max(1, int(timeout_s))))


def frame(data: bytes) -> bytes:
    return varint(len(data)) + data


class RelayedGossip:
    """Sends our messages to relayed-only peers and receives theirs. `serve(generation)` once per
    daemon run (after it started); `offer` from the writer; `run_sender` is a thread's target."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.outbound: collections.deque[tuple[str, bytes]] = collections.deque()
        self.wake = threading.Condition(shared.lock)
        self.refused_at: dict[str, float] = {}
        o = shared.options
        self._table = StreamTable(o.relayed_streams, o.relayed_streams_per_sender)
        # one thread per stream in the table (a displaced stream's thread ends at once when cut)
        self._workers = ThreadPoolExecutor(o.relayed_streams, thread_name_prefix="p2pd-relayed-in")

    # -- inbound ---------------------------------------------------------------------------------
    def serve(self, generation: int) -> None:
        """Listens on a socket in the daemon's private folder and registers it for RELAYED_PROTOCOL."""
        s = self.shared
        socket_path = s.socket_for(generation)
        if socket_path is None or not s.topics():
            return  # a relay node subscribes nothing: it takes no messages
        path = socket_path.parent / "relayed.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chmod(path, 0o600)
        listener.listen(64)
        with ControlConnection(socket_path, s.options.control_timeout_s) as conn:
            conn.request(stream_handler_request(path))
        s.spawn(lambda: self._accept(listener, generation), "p2pd-relayed-accept")

    def _accept(self, listener: socket.socket, generation: int) -> None:
        s = self.shared
        listener.settimeout(0.5)
        try:
            while not s.stop.is_set() and s.socket_for(generation) is not None:
                try:
                    sock, _ = listener.accept()
                except socket.timeout:
                    continue
                self._admit(sock)
        except OSError:
            pass
        finally:
            listener.close()

    def _admit(self, sock: socket.socket) -> None:
        """Names the stream's sender (the daemon's StreamInfo, written as it connects to us), takes
        the stream into the table, cuts what it displaced, and hands it to a thread of its own."""
        s = self.shared
        stream = StreamDeadline(sock, s.options.relayed_stream_grace_s, s.options.relayed_min_rate)
        conn = ControlConnection.on_socket(stream, s.options.control_timeout_s)
        try:
            sender = peer_id_text(conn.read(pb.StreamInfo).peer)
        except (ControlError, ValueError) as err:
            s.bump("relayed_refused")
            log.debug("relayed stream without a sender: %s", err)
            conn.close()
            return
        entry = TableEntry(sender, stream.cut)
        for displaced in self._table.admit(entry):
            displaced.cut()  # its thread counts it (relayed_evicted) as its read ends
        try:
            self._workers.submit(self._take, conn, entry, stream)
        except RuntimeError:  # closing: the pool takes no more
            self._table.release(entry)
            conn.close()

    def _take(self, conn: ControlConnection, entry: TableEntry, stream: StreamDeadline) -> None:
        s = self.shared
        sender = entry.sender
        try:
            count = conn._read_varint()
            if not 1 <= count <= MAX_PER_STREAM:
                raise ControlError(f"a stream announced {count} messages (1 to {MAX_PER_STREAM} allowed)")
            for _ in range(count):
                topic = conn.read_bytes(MAX_TOPIC_BYTES).decode("utf-8", "replace")
                if not self.deliver(sender, topic, conn.read_bytes(s.options.max_msg_bytes)):
                    return  # a cut flooder: the rest of its stream is not read, nor acknowledged
            stream.sendall(ACK)
            conn.next_bytes(0)  # the sender closes once it has the ACK (a frame instead is refused)
        except (ControlError, ValueError, OSError) as err:
            outcome = ("relayed_evicted" if entry.evicted else "relayed_timed_out" if stream.timed_out
                       else "relayed_refused")
            s.bump(outcome)
            log.debug("relayed stream from %s ended (%s): %s", sender, outcome, err)
        finally:
            self._table.release(entry)
            conn.close()

    def deliver(self, sender: str, topic: str, data: bytes) -> bool:
        """As gossip is delivered (Shared.take_in, under the authenticated sender); False once the
        sender is cut for flooding."""
        taken = self.shared.take_in(sender, topic, data, path=STREAM)
        if taken == TAKEN_IN:
            with self.shared.lock:
                relayed = sender in self.shared.relayed_peers
            self.shared.bump("relayed_received" if relayed else "direct_received")
        return taken != TAKEN_CUT

    # -- outbound --------------------------------------------------------------------------------
    def offer(self, topic: str, data: bytes) -> None:
        """Queues one of our own published messages for the relayed-only and direct peers (if any)."""
        s = self.shared
        direct = s.direct_targets(time.monotonic())
        with s.lock:
            if not s.relayed_peers and not direct:
                return
            if len(data) > MAX_RELAYED_BYTES:  # a direct peer still gets it by gossip; a relayed-only one never
                s.stats["relayed_too_big" if s.relayed_peers else "direct_too_big"] += 1
                return
            if len(self.outbound) >= OUTBOUND_MAX:
                self.outbound.popleft()
                s.stats["relayed_dropped_outbound"] += 1
            self.outbound.append((topic, data))
            self.wake.notify()

    def run_sender(self) -> None:
        s = self.shared
        while True:
            with s.lock:
                while not self.outbound and not s.stop.is_set():
                    self.wake.wait(0.5)
                if s.stop.is_set():
                    return
                batch = self._next_batch()
                relayed = set(s.relayed_peers)
            for peer in sorted(relayed | s.direct_targets(time.monotonic())):
                if time.monotonic() - self.refused_at.get(peer, -REFUSED_RETRY_S) < REFUSED_RETRY_S:
                    continue
                self._deliver_to(peer, batch)

    def _next_batch(self) -> list[tuple[str, bytes]]:
        """The queue's head, and what follows it up to MAX_PER_STREAM messages or BATCH_BYTES (called
        under the lock): a batch must fit in one relayed connection's 128 KiB with room to spare."""
        batch, size = [self.outbound.popleft()], 0
        size = len(batch[0][1])
        while self.outbound and len(batch) < MAX_PER_STREAM and size + len(self.outbound[0][1]) <= BATCH_BYTES:
            size += len(self.outbound[0][1])
            batch.append(self.outbound.popleft())
        return batch

    def _deliver_to(self, peer: str, batch: list[tuple[str, bytes]]) -> None:
        """Sends `batch` to `peer`, retrying (SEND_TRIES in all, backing off) while the peer stays
        relayed-only or a direct peer: the relay resets a relayed connection after 128 KiB or 2
        minutes (nat.py), and the stream in flight with it; the peers redial within seconds."""
        s = self.shared
        kind = "relayed"
        for attempt in range(SEND_TRIES):
            with s.lock:  # (a peer that dropped is redialed by STREAM_OPEN itself, through the relay)
                generation, kind = s.generation, "relayed" if peer in s.relayed_peers else "direct"
            if s.stop.is_set() or (kind == "direct" and peer not in s.direct_targets(time.monotonic())):
                break  # hole punching gave a direct connection to a peer we do not use: gossip reaches it
            if self._send(peer, batch, generation, kind):
                return
            if time.monotonic() - self.refused_at.get(peer, -REFUSED_RETRY_S) < REFUSED_RETRY_S:
                break
            s.stop.wait(RETRY_BACKOFF_S * 2 ** attempt)
        s.bump(f"{kind}_given_up", len(batch))

    def _send(self, peer: str, batch: list[tuple[str, bytes]], generation: int, kind: str = "relayed") -> bool:
        s = self.shared
        socket_path = s.socket_for(generation)
        if socket_path is None:
            return False
        timeout = s.options.control_timeout_s
        try:
            with ControlConnection(socket_path, timeout) as conn:
                conn.request(stream_open_request(peer, timeout))
                conn.sock.sendall(varint(len(batch)) + b"".join(frame(t.encode()) + frame(d) for t, d in batch))
                if conn._read_exactly(1) != ACK:  # closing before it could lose what is in flight
                    raise ControlError("the stream ended without an acknowledgement")
            s.bump(f"{kind}_sent", len(batch))
        except (ControlError, OSError) as err:
            s.bump(f"{kind}_send_failures")
            if "protocol" in str(err).lower():
                self.refused_at[peer] = time.monotonic()
            log.debug("relayed send to %s failed: %s", peer, err)
            return False
        return True

    def close(self) -> None:
        self._workers.shutdown(wait=False, cancel_futures=True)
