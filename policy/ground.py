"""policy/'s own stdlib plumbing: files written whole or not at all (the checkpoints' LATEST), the
environment of a child `python -m policy.vllm_server`, and a child that dies with its parent.

policy/ imports no other package of this repository (tests/codebase/test_dependency_rule.py), so it keeps
these beside it; node/ground/ and protocol/ground.py hold the same plumbing for their layers, with
the same rule: every failed write raises and leaves the old file or the new one, never a torn one
and no temp file (node/ground/files.py explains it); die_with_parent has no startup race
(node/ground/parent_death.py explains it). Standard library only."""
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
