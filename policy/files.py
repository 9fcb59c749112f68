"""Files written whole or not at all. The standard library only: node.json, metrics.jsonl and the
checkpoints' LATEST are written through here without loading torch (`swarm-node status` and the
command line's other light paths never do)."""
from __future__ import annotations

import os
from pathlib import Path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace `path` by a file holding `text`: written beside it, fsynced, renamed over it, then
    the directory fsynced so the rename itself survives a crash of the machine. A reader or a
    crash sees the old file or the new one, never a torn one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of directory `path` (a rename into it, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
