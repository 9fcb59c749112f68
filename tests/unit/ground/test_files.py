"""policy/ground.py (protocol/ground.py is its twin: tests/codebase/test_ground_twins.py): a file is
replaced whole or not at all, by one failure rule for the node's, policy's and protocol's files;
the ground loads nothing but the standard library."""
from __future__ import annotations

import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from policy.ground import atomic_write_bytes, atomic_write_text, fsync_dir

REPO = Path(__file__).resolve().parents[3]


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
        atomic_write_text(target, "half written \ud800")  # a lone surrogate cannot be encoded
    with pytest.raises(TypeError):
        atomic_write_bytes(target, "not bytes")  # fails inside write(), after the temp file exists
    assert target.read_text() == "complete\n"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_a_failed_directory_sync_raises_instead_of_passing_silently(tmp_path):
    """The one rule: every failure raises (protocol's copy once skipped a directory it could not sync)."""
    with pytest.raises(FileNotFoundError):
        fsync_dir(tmp_path / "gone")
    fsync_dir(tmp_path)


def test_the_mode_is_set_before_the_first_byte_and_the_umask_applies(tmp_path):
    key, fault_file = tmp_path / "identity.key", tmp_path / "faults.json"
    atomic_write_bytes(key, b"secret", mode=0o600)
    atomic_write_bytes(fault_file, b"{}", mode=0o644)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(fault_file.stat().st_mode) == 0o644
    code = ("import os, stat, sys; os.umask(0o077); from policy.ground import atomic_write_text; "
            "atomic_write_text(sys.argv[1], 'x'); print(oct(stat.S_IMODE(os.stat(sys.argv[1]).st_mode)))")
    private = subprocess.run([sys.executable, "-c", code, str(tmp_path / "node.json")], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert private.stdout.strip() == "0o600", private.stderr  # a service's UMask=0077 keeps node.json private


def test_threads_writing_one_file_never_tear_it(tmp_path):
    """Each write has a temp file of its own (a name per process only let two threads share one)."""
    target = tmp_path / "peers.json"
    payloads = [bytes([i]) * 65536 for i in range(8)]
    errors: list[BaseException] = []

    def write(data: bytes) -> None:
        try:
            for _ in range(20):
                atomic_write_bytes(target, data)
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and target.read_bytes() in payloads
    assert [p.name for p in tmp_path.iterdir()] == ["peers.json"]


def test_the_ground_floor_imports_the_standard_library_only():
    code = ("import sys; before = set(sys.modules); "
            "import policy.ground; "
            "new = {m.split('.')[0] for m in set(sys.modules) - before} - {'policy'}; "
            "sys.exit(f'imported {sorted(new)}' if new - set(sys.stdlib_module_names) else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
