"""The suite's warm children, client side (tests/support/warm_children.py is the server). Python imports this
at start-up in every child of a test session (tests/conftest.py puts this folder on PYTHONPATH).

When the child is `python -m node.cli ...` (or another module of WARM_MODULES or WARM_PACKAGES: the
experiment and bench scripts) and the session's fork
server answers, this process does not import torch and transformers (about 4 s of CPU): it hands its
argv, working directory, environment and stdin/stdout/stderr to the server, which forks an
already-imported copy of itself to run the module; this process stays as its stand-in. It forwards
the stop signals it receives, and exits as the forked child did (its code, or its signal). If this
process is SIGKILLed the server kills the child. Anything else (no server, another network or mount
namespace as under `ip netns exec`, an environment the server did not import with) starts as usual.
Only the standard library here: it runs before anything else in the child."""
from __future__ import annotations

import json
import os
import signal
import socket
import sys

WARM_MODULES = ("node.cli", "node.hostile.process")
WARM_PACKAGES = ("scripts.experiments.", "scripts.bench.")  # their modules too: they import torch
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def namespaces() -> str:
    """This process's network and mount namespaces: the forked child lives in the server's."""
    return ",".join(os.readlink(f"/proc/self/ns/{kind}") for kind in ("net", "mnt"))


def _stdio_fds() -> list[int]:
    """fds 0-2, with /dev/null standing in for a closed one."""
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def _read_line(sock: socket.socket, buffered: bytearray) -> str:
    while b"\n" not in buffered:
        chunk = sock.recv(4096)
        if not chunk:
            return ""
        buffered += chunk
    line, _, rest = bytes(buffered).partition(b"\n")
    buffered[:] = rest
    return line.decode()


def _connect(path: str) -> socket.socket | None:
    argv = sys.orig_argv
    if len(argv) < 3 or argv[1] != "-m" or not (argv[2] in WARM_MODULES or argv[2].startswith(WARM_PACKAGES)):
        return None
    try:
        if namespaces() != os.environ.get("SWARM_TEST_WARM_NAMESPACES"):
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(path)
        request = json.dumps({"argv": argv[2:], "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        socket.send_fds(sock, [len(request).to_bytes(8, "big") + request], _stdio_fds())
        return sock
    except OSError:
        return None


def _exit_like(code: int) -> None:
    """Ends this process as the child ended: its exit code, or killed by the same signal."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def delegate(path: str) -> None:
    """Runs the module in a child of the fork server at `path` and never returns, or returns at
    once (nothing done) when this child is not one the server can run."""
    sock = _connect(path)
    if sock is None:
        return
    buffered = bytearray()
    try:
        answer = _read_line(sock, buffered)
    except OSError:
        answer = ""
    if not answer.startswith("pid "):  # "fallback" (or no answer): start as usual
        sock.close()
        return
    pid = int(answer.split()[1])
    for sig in FORWARDED:
        signal.signal(sig, lambda number, _frame: os.kill(pid, number))
    sock.settimeout(None)
    answer = _read_line(sock, buffered)
    if answer.startswith("exit "):
        _exit_like(int(answer.split()[1]))
    os.write(2, b"warm children: the fork server went away before the child ended\n")
    os._exit(1)


if __name__ == "sitecustomize" and os.environ.get("SWARM_TEST_WARM_SOCKET"):  # not when tests import it
    delegate(os.environ["SWARM_TEST_WARM_SOCKET"])
