"""The go-libp2p daemon (`p2pd`, shipped in the hivemind wheel) as a child process of the node.

* Its identity is our Ed25519 key (written to a 0600 key file in a private 0700 folder), so its
  peer id is the signer's; `start` checks that with IDENTIFY.
* It never dials anything we did not name: it runs without `-b` (without an explicit
  `-bootstrapPeers` list that dials the public IPFS bootstrap peers, and with one the daemon
  exits when none of them answers: a node whose bootstrap peer is down must still start). The
  transport dials bootstrap and cached peers itself (CONNECT) and re-dials them with backoff
  while it has fewer connections than it wants (bounds.py, which also sets the daemon's
  connection manager).
  AutoNAT, relays, announced and mapped addresses follow NatOptions (nat.py: its flags, and the
  loopback-only metrics listener through which we read what AutoNAT concluded).
* It dies with us: Linux PR_SET_PDEATHSIG(SIGKILL) kills it if the thread that started it goes
  away (so a long-lived thread must start it), and `stop` / atexit kill it on a normal exit.
"""
from __future__ import annotations

import atexit
import functools
import importlib.util
import logging
import os
import shutil
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

from protocol.ground import die_with_parent, stop_processes
from .addrs import addr_text, peer_id_text
from .bounds import ConnectionBounds
from .control import ControlConnection, ControlError, identify_request

log = logging.getLogger(__name__)

HIVEMIND_PIN = "hivemind==1.1.12"
NAT_OFF = ["-relay=false", "-relayService=false", "-autonat=false", "-natPortMap=false"]  # a daemon on its own
_ED25519_PRIVATE_KEY_HEADER = bytes([0x08, 0x01, 0x12, 0x40])  # PrivateKey{Type: Ed25519, Data: 64 bytes}
_LIVE: "weakref.WeakSet[DaemonProcess]" = weakref.WeakSet()


class DaemonStartError(RuntimeError):
    """The daemon did not come up: what went wrong, its stderr tail and what to do."""


def daemon_binary() -> Path:
    """The p2pd executable inside the installed hivemind package (found without importing it)."""
    spec = importlib.util.find_spec("hivemind")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(folder) / "hivemind_cli" / "p2pd"
        if binary.is_file():
            if not os.access(binary, os.X_OK):
                raise DaemonStartError(f"{binary} is not executable: run `chmod +x {binary}`")
            return binary
    raise DaemonStartError(f"the go-libp2p daemon was not found: install it with `pip install {HIVEMIND_PIN}` "
                           "(scripts/setup.sh does), or set swarm.transport=libp2p for the pure-Python transport")


def private_key_file_bytes(seed: bytes) -> bytes:
    """libp2p's protobuf PrivateKey encoding of an Ed25519 key (the format `p2pd -id` reads):
    Type = 1 (Ed25519), Data = 32-byte seed + 32-byte public key."""
    from ...identity import NodeIdentity

    identity = NodeIdentity.from_seed(seed)
    return _ED25519_PRIVATE_KEY_HEADER + bytes(seed) + identity.public_key_bytes


class DaemonProcess:
    """One run of p2pd. `start` returns (peer id, listen multiaddrs) or raises DaemonStartError."""

    def __init__(self, seed: bytes, *, listen: list[str], expected_peer_id: str,
                 control_timeout_s: float = 5.0, conn_bounds: ConnectionBounds | None = None,
                 nat_flags: list[str] | None = None) -> None:
        self.seed = bytes(seed)
        self.nat_flags = list(nat_flags) if nat_flags is not None else NAT_OFF
        self.conn_bounds = conn_bounds  # its connection manager's flags (bounds.py); None or unbounded = off
        self.listen = list(listen)
        self.expected_peer_id = expected_peer_id
        self.control_timeout_s = control_timeout_s
        self.dir = Path(tempfile.mkdtemp(prefix="p2pd-"))  # 0700; short path: unix sockets allow ~100 bytes
        self.socket_path = self.dir / "control.sock"
        self.stderr_path = self.dir / "stderr.log"
        self.proc: subprocess.Popen | None = None

    def command(self, binary: Path, key_file: Path) -> list[str]:
        cmd = [str(binary), f"-listen=/unix{self.socket_path}", f"-id={key_file}",
               f"-hostAddrs={','.join(self.listen)}", "-pubsub", "-pubsubRouter=gossipsub",
               # server mode: in auto mode a node without a public address stays a DHT client and
               # peers on loopback or a LAN never enter each other's routing tables
               "-dhtServer", *self.nat_flags]
        if self.conn_bounds is not None:
            cmd += self.conn_bounds.daemon_flags()
        return cmd  # never -b (see the module docstring)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float) -> tuple[str, list[str]]:
        binary = daemon_binary()
        key_file = self.dir / "identity.key"
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(private_key_file_bytes(self.seed))
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(self.command(binary, key_file), stdin=subprocess.DEVNULL,
                                         stdout=stderr, stderr=stderr, preexec_fn=functools.partial(die_with_parent, os.getpid()),
                                         start_new_session=True)  # a terminal's Ctrl-C reaches the node only
        _LIVE.add(self)
        deadline = time.monotonic() + timeout_s
        last_error = "the control socket never appeared"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self._start_error(f"p2pd exited with code {self.proc.returncode} while starting")
            if self.socket_path.exists():
                try:
                    with ControlConnection(self.socket_path, self.control_timeout_s) as conn:
                        identity = conn.request(identify_request()).identify
                    break
                except ControlError as err:
                    last_error = str(err)
            time.sleep(0.02)
        else:
            raise self._start_error(f"p2pd did not answer on {self.socket_path} within {timeout_s:.0f} s "
                                    f"({last_error})")
        peer_id = peer_id_text(identity.id)
        if peer_id != self.expected_peer_id:
            raise self._start_error(f"p2pd runs as peer {peer_id}, not our identity {self.expected_peer_id}: "
                                    "the key file was not read as ours")
        addrs = [a for a in (addr_text(raw) for raw in identity.addrs) if a]
        return peer_id, addrs

    def stderr_tail(self, max_chars: int = 2000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-max_chars:].strip()
        except OSError:
            return ""

    def _start_error(self, what: str) -> DaemonStartError:
        tail = self.stderr_tail()
        self.stop()
        return DaemonStartError(
            f"{what}. Command: {' '.join(self.command(Path('p2pd'), Path('<key>')))}\n"
            f"p2pd stderr (last lines):\n{tail or '(empty)'}\n"
            "What to do: check that the listen addresses (swarm.listen) are free and valid multiaddrs "
            "(/ip4/127.0.0.1/tcp/0 picks a free port) "
            f"and that {HIVEMIND_PIN} is installed; or use swarm.transport=libp2p.")

    def stop(self, grace_s: float = 2.0) -> None:
        """SIGTERM, then SIGKILL after `grace_s`; removes the private folder. Idempotent."""
        if self.proc is not None:
            stop_processes([self.proc], timeout=grace_s)
        shutil.rmtree(self.dir, ignore_errors=True)
        _LIVE.discard(self)


@atexit.register
def _kill_all_daemons() -> None:
    for daemon in list(_LIVE):
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.proc.kill()
