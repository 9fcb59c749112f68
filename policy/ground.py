"""Stdlib plumbing, policy/'s and node/'s: files written whole or not at all (the checkpoints'
LATEST, node.json, metrics rewrites), the environment of a child `python -m ...` of this repository
(the vLLM server, testnet nodes, scorer workers), and a child that dies with its parent.

node/ imports it from here (node -> policy is allowed); protocol/ may import neither node/ nor
policy/ (tests/codebase/test_dependency_rule.py), so protocol/ground.py is this module's twin for the
parts protocol needs, and tests/codebase/test_ground_twins.py holds the twins to the same source.

Atomic writes: a temp file beside the target (a name of its own: two threads may write one
target), created with its mode, less the umask, as open() does (a service's UMask=0077 keeps every
file private), before any byte is written; fsynced, renamed over the target, then the directory
fsynced so the rename itself survives a crash of the machine. The rule: every failure raises, and
leaves the old file or the new one, never a torn one, and no temp file. A failure before the rename
keeps the old file; a failed directory sync after it raises too (the new file is in place, but
whether it survives a crash is unknown: the caller decides, as the peer cache does by logging it).

die_with_parent, without the startup race: if the parent dies after the fork but before prctl takes
effect, no signal ever comes. The child is then already reparented, so it compares getppid() with
the parent pid recorded BEFORE the fork/exec; comparing with 1 would miss it under a subreaper
(systemd, tini, a container's init), which adopts orphans under its own pid.

Standard library only, so light paths (`swarm-node status`) never load torch."""
from __future__ import annotations

import ctypes
import os
import secrets
import signal
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


def atomic_write_text(path: str | os.PathLike[str], text: str, mode: int = FILE_MODE) -> None:
    """atomic_write_bytes of `text` in UTF-8 (text that cannot be encoded raises before any file exists)."""
    atomic_write_bytes(path, text.encode("utf-8"), mode)


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


ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """os.environ plus `extra`, with the repository root first on PYTHONPATH (an existing
    PYTHONPATH kept after it: the parent's other imports still resolve in the child)."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": pythonpath, **extra}
