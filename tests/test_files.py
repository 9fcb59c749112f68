"""policy/files.py and protocol/files.py: a file is replaced whole or not at all; policy's without torch."""
from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from policy.files import atomic_write_text
from protocol.files import atomic_write_bytes

REPO = Path(__file__).resolve().parents[1]


def test_atomic_write_replaces_the_file_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "node.json"
    atomic_write_text(target, "old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["node.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp_file(tmp_path):
    target = tmp_path / "metrics.jsonl"
    atomic_write_text(target, "complete\n")
    with pytest.raises(UnicodeEncodeError):
        atomic_write_text(target, "half written \ud800")  # a lone surrogate fails inside write()
    assert target.read_text() == "complete\n"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_policy_files_imports_the_standard_library_only():
    code = ("import sys; before = set(sys.modules); import policy.files; "
            "new = {m.split('.')[0] for m in set(sys.modules) - before} - {'policy'}; "
            "sys.exit(f'imported {sorted(new)}' if new - set(sys.stdlib_module_names) else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_protocol_atomic_write_sets_the_mode_and_a_failed_write_keeps_the_old_file(tmp_path):
    key, fault_file = tmp_path / "identity.key", tmp_path / "faults.json"
    atomic_write_bytes(key, b"secret")
    atomic_write_bytes(fault_file, b"{}", mode=0o644)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(fault_file.stat().st_mode) == 0o644
    with pytest.raises(TypeError):
        atomic_write_bytes(key, "not bytes")  # fails inside write(), after the temp file exists
    assert key.read_bytes() == b"secret"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["faults.json", "identity.key"]
