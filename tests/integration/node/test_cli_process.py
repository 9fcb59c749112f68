"""The CLI's process-wide choices: where keygen writes by default, and PYTHONHASHSEED pinned only for
the tasks that need it (node/tasks/hash_seed.py)."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from node.service import console as session
from node.config.schema import load_config
from node.tasks.hash_seed import datasets_needing_fixed_hash_seed
from protocol import NodeIdentity

from tests.support.processes import repo_env

ROOT = Path(__file__).resolve().parents[3]


def run_cli(*args, cwd, env=()):
    return subprocess.run([sys.executable, "-m", "node.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env=repo_env(**dict(env)))


def test_keygen_without_out_writes_under_the_user_config_dir_never_the_working_dir(tmp_path):
    work, config = tmp_path / "checkout", tmp_path / "config"
    work.mkdir()
    out = run_cli("keygen", cwd=work, env={"XDG_CONFIG_HOME": str(config)})
    assert out.returncode == 0, out.stderr
    key = config / "swarm-node" / "identity.key"
    assert NodeIdentity.load(key).peer_id() == out.stdout.strip()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert list(work.iterdir()) == []  # nothing a `git add -A` could publish
    again = run_cli("keygen", cwd=work, env={"XDG_CONFIG_HOME": str(config)})
    assert again.returncode == 2 and "--force" in again.stderr  # never overwritten silently
    assert NodeIdentity.load(key).peer_id() == out.stdout.strip()


def test_key_files_are_git_ignored():
    out = subprocess.run(["git", "check-ignore", "-q", "some/dir/identity.key"], cwd=ROOT, timeout=30)
    assert out.returncode == 0


def test_the_cli_keeps_hash_randomization_on_for_tasks_that_do_not_need_it(tmp_path):
    """The whole process used to be re-executed with PYTHONHASHSEED=0 for every command."""
    probe = ("import sys; from node.cli import main; sys.argv = ['swarm-node', 'keygen', '--out', sys.argv[1]]; "
             "main(); print('hash_randomization', sys.flags.hash_randomization)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "k.key")], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env=repo_env(env))
    assert out.returncode == 0, out.stderr
    assert "hash_randomization 1" in out.stdout


def test_hash_seed_is_pinned_exactly_when_a_configured_dataset_depends_on_it(monkeypatch):
    tiny = load_config("tiny")
    ransom = load_config("smollm2", None, ["tasks.datasets={ransom_note = 1.0}"])
    assert datasets_needing_fixed_hash_seed(tiny.tasks.source, tiny.tasks.datasets, tiny.eval.ood) == []
    assert datasets_needing_fixed_hash_seed(ransom.tasks.source, ransom.tasks.datasets) == ["ransom_note"]
    assert datasets_needing_fixed_hash_seed("synthetic", {"ransom_note": 1.0}) == []

    calls = []

    class Restarted(Exception):
        pass

    def fake_execve(path, argv, env):
        calls.append((argv, env.get("PYTHONHASHSEED")))
        raise Restarted

    monkeypatch.setattr(session.os, "execve", fake_execve)
    monkeypatch.setattr(session, "_may_reexec", True)
    monkeypatch.setattr("node.tasks.hash_seed.hash_randomization_off", lambda: False)
    session.pin_hash_seed_if_needed(tiny)
    assert calls == []
    with pytest.raises(Restarted):
        session.pin_hash_seed_if_needed(ransom)
    assert calls[0][0][1:3] == ["-m", "node.cli"] and calls[0][1] == "0"
    monkeypatch.setattr("node.tasks.hash_seed.hash_randomization_off", lambda: True)  # already pinned
    session.pin_hash_seed_if_needed(ransom)
    assert len(calls) == 1
