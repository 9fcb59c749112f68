"""policy/ground.py child_env: the environment of the node's child Python processes (testnet nodes and
hostile peers, scorer workers)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from policy.ground import ROOT, child_env


def test_a_child_imports_the_repository_from_any_directory_and_keeps_the_parents_path(tmp_path, monkeypatch):
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "parent_only.py").write_text("X = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(extra))
    env = child_env(PYTHONHASHSEED="0")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), str(extra)] and env["PYTHONHASHSEED"] == "0"
    probe = "import policy.ground, parent_only; print(policy.ground.__file__)"
    child = subprocess.run([sys.executable, "-c", probe],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert Path(child.stdout.strip()).resolve() == ROOT / "policy" / "ground.py"  # this checkout, not another
    monkeypatch.delenv("PYTHONPATH")
    assert child_env()["PYTHONPATH"] == str(ROOT)
