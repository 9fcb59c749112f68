"""Files written whole or not at all, for protocol/ (the identity key, the peer cache, a testnet's
fault file). protocol/ imports nothing of policy/, whose policy/files.py gives the node's files the
same guarantee: a temp file beside the target, fsynced, renamed over it, then the directory
fsynced, so a crash leaves the old file or the new one, never a torn one."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = 0o600) -> None:
    """Replace `path` by a file of `mode` holding `data` (the mode is set before any byte is
    written: a key file's secret is never readable by others, not even half written)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Best effort: the rename is durable once the directory is synced, where the system allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
