"""The environment for a child Python process of the node that imports this repository's packages
(`python -m node....`): whatever directory it starts in, and whatever PYTHONPATH the parent had."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """os.environ plus `extra`, with the repository root first on PYTHONPATH (an existing
    PYTHONPATH kept after it: the parent's other imports still resolve in the child)."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": pythonpath, **extra}
