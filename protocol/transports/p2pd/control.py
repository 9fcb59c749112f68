"""A small synchronous client for the go-libp2p daemon's control socket (p2pd.proto).

Framing: every message is one protobuf (`Request`, `Response`, `PSMessage`) preceded by its
length as an unsigned varint, over a unix stream socket. Request flow, as the daemon serves it:
a connection carries a sequence of request/response pairs, except that a pubsub SUBSCRIBE turns
its connection into a one-way stream of `PSMessage`s after the OK response (closing the
connection cancels the subscription). Every call here has a socket timeout, so a stuck daemon
surfaces as `ControlError` instead of a hung thread.
"""
from __future__ import annotations

import socket
from pathlib import Path

from proto import p2pd_control_pb2 as pb

MAX_FRAME_BYTES = 8 << 20  # above the daemon's own message limits: a bigger length is corruption


class ControlError(OSError):
    """The control socket failed, timed out, or the daemon answered ERROR."""


def encode_frame(message) -> bytes:
    body = message.SerializeToString()
    return varint(len(body)) + body


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


class ControlConnection:
    """One connection to the daemon's control socket; not thread-safe (one owner thread)."""

    def __init__(self, socket_path: Path, timeout_s: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self._buffer = bytearray()
        try:
            self.sock.connect(str(socket_path))
        except OSError as err:
            self.sock.close()
            raise ControlError(f"cannot connect to the daemon's control socket {socket_path}: {err}") from err

    @classmethod
    def on_socket(cls, sock: socket.socket, timeout_s: float) -> ControlConnection:
        """A connection over a socket the daemon opened to us (an inbound stream's)."""
        conn = cls.__new__(cls)
        conn.sock, conn._buffer = sock, bytearray()
        sock.settimeout(timeout_s)
        return conn

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def __enter__(self) -> ControlConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, message) -> None:
        try:
            self.sock.sendall(encode_frame(message))
        except OSError as err:
            raise ControlError(f"writing to the daemon's control socket failed: {err}") from err

    def read(self, message_type):
        """The next length-delimited message (raises ControlError on EOF, timeout or garbage)."""
        size = self._read_varint()
        if size > MAX_FRAME_BYTES:
            raise ControlError(f"daemon sent a {size}-byte frame (> {MAX_FRAME_BYTES}): stream out of sync")
        message = message_type()
        try:
            message.ParseFromString(self._read_exactly(size))
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise ControlError(f"undecodable {message_type.__name__} from the daemon: {err}") from err
        return message

    def read_bytes(self, limit: int) -> bytes:
        """The next varint-length-prefixed byte string of a stream (ControlError above `limit`)."""
        size = self._read_varint()
        if size > limit:
            raise ControlError(f"a {size}-byte frame exceeds the limit of {limit} bytes")
        return self._read_exactly(size)

    def next_bytes(self, limit: int) -> bytes | None:
        """As read_bytes, or None where the stream ended cleanly before a new frame."""
        if not self._buffer:
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout as err:
                raise ControlError("the stream sent nothing in time") from err
            except OSError as err:
                raise ControlError(f"reading the stream failed: {err}") from err
            if not chunk:
                return None
            self._buffer += chunk
        return self.read_bytes(limit)

    def request(self, request: pb.Request) -> pb.Response:
        """Send one request and return its OK response (ERROR raises ControlError with the daemon's text)."""
        self.send(request)
        response = self.read(pb.Response)
        if response.type != pb.Response.OK:
            raise ControlError(f"daemon refused {pb.Request.Type.Name(request.type)}: {response.error.msg}")
        return response

    def _read_varint(self) -> int:
        result = shift = 0
        while True:
            byte = self._read_exactly(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ControlError("daemon sent a malformed length prefix")

    def _read_exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            try:
                chunk = self.sock.recv(max(65536, n - len(self._buffer)))
            except socket.timeout as err:
                raise ControlError("the daemon's control socket did not answer in time") from err
            except OSError as err:
                raise ControlError(f"reading the daemon's control socket failed: {err}") from err
            if not chunk:
                raise ControlError("the daemon closed the control connection")
            self._buffer += chunk
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out


# --- requests (each builds the protobuf the daemon expects) --------------------------------------

def identify_request() -> pb.Request:
    return pb.Request(type=pb.Request.IDENTIFY)


def list_peers_request() -> pb.Request:
    return pb.Request(type=pb.Request.LIST_PEERS)


def connect_request(peer_id: bytes, addrs: list[bytes], timeout_s: int) -> pb.Request:
    return pb.Request(type=pb.Request.CONNECT,
                      connect=pb.ConnectRequest(peer=peer_id, addrs=addrs, timeout=timeout_s))


def disconnect_request(peer_id: bytes) -> pb.Request:
    return pb.Request(type=pb.Request.DISCONNECT, disconnect=pb.DisconnectRequest(peer=peer_id))


def tag_request(peer_id: bytes, tag: str, weight: int) -> pb.Request:
    """The daemon's connection manager values `peer_id`'s connection by `weight` (kept when it trims)."""
    return pb.Request(type=pb.Request.CONNMANAGER, connManager=pb.ConnManagerRequest(
        type=pb.ConnManagerRequest.TAG_PEER, peer=peer_id, tag=tag, weight=weight))


def trim_request() -> pb.Request:
    """The daemon's connection manager closes its least valuable connections (if over its high mark)."""
    return pb.Request(type=pb.Request.CONNMANAGER, connManager=pb.ConnManagerRequest(type=pb.ConnManagerRequest.TRIM))


def subscribe_request(topic: str) -> pb.Request:
    return pb.Request(type=pb.Request.PUBSUB, pubsub=pb.PSRequest(type=pb.PSRequest.SUBSCRIBE, topic=topic))


def publish_request(topic: str, data: bytes) -> pb.Request:
    return pb.Request(type=pb.Request.PUBSUB, pubsub=pb.PSRequest(type=pb.PSRequest.PUBLISH, topic=topic, data=data))


def topic_peers_request(topic: str) -> pb.Request:
    return pb.Request(type=pb.Request.PUBSUB, pubsub=pb.PSRequest(type=pb.PSRequest.LIST_PEERS, topic=topic))
