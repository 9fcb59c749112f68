"""The environment for a child Python process that imports this repository's packages (`python -m
node....`, the vLLM server `python -m policy.vllm_server`): whatever directory it starts in, and
whatever PYTHONPATH the parent had; and stopping children by their handles. Stdlib only (the ground
floor: node/ground/__init__.py)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    """os.environ plus `extra`, with the repository root first on PYTHONPATH (an existing
    PYTHONPATH kept after it: the parent's other imports still resolve in the child)."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": pythonpath, **extra}


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
