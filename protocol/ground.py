"""protocol/'s stdlib plumbing: files written whole or not at all (the identity key, the peer
cache), a child (the p2pd daemon) that dies with its parent, and stopping children by handle.

protocol/ imports no other package of this repository (tests/codebase/test_dependency_rule.py), so
this is the twin of policy/ground.py (where the rules are explained), for the parts protocol needs:
tests/codebase/test_ground_twins.py holds each function here to the same source as its twin there.
stop_processes lives only here; node/ imports it from here. Standard library only."""
from __future__ import annotations

import ctypes
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

FILE_MODE = 0o666  # open()'s: the umask decides; a secret passes 0o600


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = FILE_MODE) -> None:
    """Replace `path` by a file of `mode` (less the umask) holding `data`: a key file's secret is never
    readable by others, not even half written."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of directory `path` (a rename into it, a new file) durable; raises if it cannot."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


PR_SET_PDEATHSIG = 1
ORPHANED_EXIT = 1  # the status of a child that found its parent gone (nobody is left to read it)


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """In the child (a preexec_fn, or first thing after exec): have the kernel send `sig` when the
    parent goes (on Linux: the parent THREAD that forked us), and exit at once if it already went."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(ORPHANED_EXIT)


def stop_processes(procs: list[subprocess.Popen], timeout: float = 20.0) -> None:
    """SIGTERM each of `procs` still running, wait (bounded), then SIGKILL what is left: by handle
    only, never by name."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=timeout)
