"""Starting, waiting on and ending the processes a test started (ended by Popen handle only)."""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from node.service.child_env import stop_processes as stop  # noqa: F401 (the tests' name for it)

ROOT = Path(__file__).resolve().parents[1]


def repo_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment of a child process that imports this checkout: `base` (default os.environ)
    with PYTHONPATH set to the repository root, then `extra` on top."""
    return {**(os.environ if base is None else base), "PYTHONPATH": str(ROOT), **extra}


def wait_for(predicate, what: str, procs: list[subprocess.Popen], timeout: float = 120.0) -> None:
    """Polls `predicate` until true; fails at once if a process exits, and after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for p in procs:
            assert p.poll() is None, f"a process exited early ({p.returncode}) while waiting for {what}"
        time.sleep(0.25)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
