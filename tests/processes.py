"""Waiting on and ending the processes a test started (by Popen handle only)."""
from __future__ import annotations

import subprocess
import time


def stop(procs: list[subprocess.Popen], timeout: float = 20.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=timeout)


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
