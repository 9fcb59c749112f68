"""Ending the processes a test started: terminate, wait, kill what will not stop (by Popen handle only)."""
from __future__ import annotations

import subprocess


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
