"""The environment of the processes a test starts, and ending them (by Popen handle only; waiting on
them: tests/support/waiting.py wait_until with procs=...)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from protocol.ground import stop_processes as stop  # noqa: F401 (the tests' name for it)

ROOT = Path(__file__).resolve().parents[2]
WARM_SITE = ROOT / "tests" / "support" / "warm_site"


def repo_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment of a child process that imports this checkout: `base` (default os.environ)
    with PYTHONPATH set to the repository root, then `extra` on top. The session's warm-children
    hook (tests/support/warm_children.py) stays on PYTHONPATH after the root when os.environ has it."""
    base = os.environ if base is None else base
    paths = [str(ROOT), *(p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p == str(WARM_SITE))]
    return {**base, "PYTHONPATH": os.pathsep.join(paths), **extra}

