"""The suite's warm children, server side: a fork server that imports torch, transformers and the
node's commands once, then forks a copy of itself for each `python -m node.cli ...` child a test
(or a harness under test) starts, instead of each child importing them again (about 4 s of CPU per
child, on the order of a hundred children in the slow tests). tests/support/warm_site/sitecustomize.py is
the client, in the child; tests/conftest.py starts one server per pytest process.

The forked child is made to look like a fresh `python -m` process: the client's argv, working
directory, environment and stdin/stdout/stderr; default signal dispositions; Python's and numpy's
global random state reseeded from the OS; the module run as __main__; exit through the interpreter's
own steps (non-daemon threads joined, atexit handlers run). What differs: the hash seed is the
server's (a child whose environment pins PYTHONHASHSEED starts as usual), and it dies with the server.
The server forks only while it runs no thread of its own, and serves a child only when the client's
environment differs from the one it started with in SWARM_NODE_* / PYTEST_* variables at most (the
ones read after import; what its own imports set, e.g. TORCHINDUCTOR_CACHE_DIR, the child gets too);
anything else is answered "fallback" (the reason goes to its log) and the client starts as usual.

    python tests/support/warm_children.py SOCKET_PATH     (PYTHONPATH: the repository root)
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "tests" / "support" / "warm_site"  # holds only sitecustomize.py: the client

from tests.support.warm_site.sitecustomize import namespaces  # noqa: E402 (stdlib only, like this module's top)

PRELOAD = ("torch", "transformers", "node.cli", "node.service.join", "node.train.assembly", "node.train.loop",
           "node.hostile.process", "node.testnet.runner", "node.observe.control", "scripts.common", "matplotlib")
RUNTIME_PREFIXES = ("SWARM_NODE_", "PYTEST_")  # read by the node after start-up, never at import
# set by a library's import in the test process after the server started (tensorboardX: crc32c's mode;
# torch: inductor's cache): a fresh child's own imports set them to the same values
SET_BY_IMPORTS = {"CRC32C_SW_MODE", "TORCHINDUCTOR_CACHE_DIR"}
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # a module renamed or missing only makes children less warm
            pass


def search_path(env) -> list[str]:
    """PYTHONPATH as Python reads it: a repeated entry changes nothing."""
    return list(dict.fromkeys(filter(None, env.get("PYTHONPATH", "").split(os.pathsep))))


def why_not_servable(env: dict[str, str]) -> str | None:
    """None when a child with environment `env` can be forked from here; else why not."""
    differing = {k for k in env.keys() | STARTED_WITH.keys() if env.get(k) != STARTED_WITH.get(k)}
    if search_path(env) == search_path(STARTED_WITH):
        differing.discard("PYTHONPATH")
    if threading.active_count() != 1:
        return f"{threading.active_count()} threads run here"
    unexpected = sorted(k for k in differing - SET_BY_IMPORTS if not k.startswith(RUNTIME_PREFIXES))
    return f"another environment: {', '.join(unexpected)}" if unexpected else None


def read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    conn.settimeout(10)
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    size = int.from_bytes(data[:8], "big")
    body = bytearray(data[8:])
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("the client left mid-request")
        body += chunk
    return json.loads(body), fds


def become_child(request: dict, fds: list[int], sockets: list[socket.socket]) -> None:
    """In the forked child: take the client's place, run its module, exit as Python would."""
    die_with_parent()
    for sock in sockets:
        sock.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**request["env"], **SET_ON_IMPORT})
    reseed()
    module, *args = request["argv"]
    sys.argv = [module, *args]  # runpy puts the module's file name first, as `-m` does
    sys.path[0] = request["cwd"]
    sys.modules.pop(module, None)  # as under `-m`, the module runs as __main__ only (its imports stay warm)
    os._exit(run_as_main(module))


def reseed() -> None:
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def run_as_main(module: str) -> int:
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = exit_code(done.code)
    except KeyboardInterrupt:
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # what the interpreter does at exit: join non-daemon threads, then atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class Server:
    def __init__(self, path: str):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.children: dict[int, socket.socket | None] = {}  # pid -> its client's connection
        self.clients: dict[socket.socket, int] = {}

    def serve_forever(self) -> None:
        while True:
            readable, _, _ = select.select([self.listener, *self.clients], [], [], 0.1)
            for sock in readable:
                if sock is self.listener:
                    self.accept()
                else:
                    self.client_left(sock)
            self.reap()

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            request, fds = read_request(conn)
        except (OSError, ValueError):
            conn.close()
            return
        try:
            why_not = why_not_servable(request["env"])
            if why_not:
                print(f"fallback for {request['argv'][:2]}: {why_not}", file=sys.stderr, flush=True)
                conn.sendall(b"fallback\n")
                conn.close()
                return
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError:
                conn.sendall(b"fallback\n")
                conn.close()
                return
            if pid == 0:  # the child never returns to this loop
                try:
                    become_child(request, fds, [self.listener, *self.clients, conn])
                finally:
                    traceback.print_exc()
                    os._exit(1)
            conn.settimeout(None)
            self.children[pid], self.clients[conn] = conn, pid
            conn.sendall(f"pid {pid}\n".encode())
        finally:
            for fd in fds:
                os.close(fd)

    def client_left(self, conn: socket.socket) -> None:
        """The client's end closed before its child exited: it was killed, so its child goes too."""
        try:
            data = conn.recv(1)
        except OSError:
            data = b""
        if data:
            return
        pid = self.clients.pop(conn)
        self.children[pid] = None
        conn.close()
        try:
            os.kill(pid, signal.SIGKILL)  # the child this server forked for that client
        except ProcessLookupError:
            pass

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                self.clients.pop(conn, None)
                try:
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()


def point_children_here() -> str | None:
    """Sets os.environ so that this process's `python -m node.cli` children ask a server at the
    returned socket path (serve_children starts it; until it listens they start as usual). Set
    before collection: test modules copy os.environ at import. None, and nothing set, when
    SWARM_TEST_WARM=0 (every child then starts cold, as outside the suite)."""
    if os.environ.get("SWARM_TEST_WARM", "1") == "0":
        return None
    path = os.path.join(tempfile.mkdtemp(prefix="warm-"), "socket")
    os.environ["PYTHONPATH"] = os.pathsep.join(search_path({"PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(HOOK), os.environ.get("PYTHONPATH", "")])}))
    os.environ["SWARM_TEST_WARM_NAMESPACES"] = namespaces()
    os.environ["SWARM_TEST_WARM_SOCKET"] = path
    return path


@contextlib.contextmanager
def serve_children(path: str):
    """Runs the server at `path` (with this process's environment, the children's) while in the block."""
    with open(os.path.join(os.path.dirname(path), "server.log"), "wb") as log:
        server = subprocess.Popen([sys.executable, __file__, path], cwd=ROOT, env=dict(os.environ),
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        yield server
    finally:
        server.terminate()  # the server this function started; its forked children die with it
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def forget(path: str | None) -> None:
    """Removes the folder of point_children_here's socket path (and the server's log there)."""
    if path:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


STARTED_WITH: dict[str, str] = {}  # the server's environment before its imports
SET_ON_IMPORT: dict[str, str] = {}  # what its imports set there (a fresh child's imports would too)


def main(path: str) -> None:
    die_with_parent()  # the pytest process that started it
    STARTED_WITH.update(os.environ)
    preload()
    SET_ON_IMPORT.update({k: v for k, v in os.environ.items() if STARTED_WITH.get(k) != v})
    print(f"imported; they set {sorted(SET_ON_IMPORT)} in the environment", file=sys.stderr, flush=True)
    server = Server(path)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1])
