"""Files written whole or not at all, with one failure rule for all of them: the identity key and the
peer cache (protocol/), node.json, metrics.jsonl and the checkpoints' LATEST (node/, policy/).

A temp file beside the target (a name of its own: two threads may write one target), created with
its mode, less the umask, as open() does (a service's UMask=0077 keeps every file private), before
any byte is written; fsynced, renamed over the target, then the directory fsynced so the rename
itself survives a crash of the machine. The rule: every failure raises, and leaves the old file or
the new one, never a torn one, and no temp file. A failure before the rename keeps the old file; a
failed directory sync after it raises too (the new file is in place, but whether it survives a
crash is unknown: the caller decides, as the peer cache does by logging it).
Standard library only (node/ground/__init__.py), so the light paths (`swarm-node status`) never
load torch."""
from __future__ import annotations

import os
import secrets
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
