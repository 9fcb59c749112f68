"""scripts/deploy/swarm-node@.service: systemd accepts it without a warning, and its command line,
run with the example environment file the way systemd would, starts a node that a stop signal
(its KillSignal) ends cleanly, checkpoint written, within its TimeoutStopSec."""
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from policy.checkpoint import latest_checkpoint_path
from tests.support.env_files import EXAMPLE, ROOT, clean_environ, read_env_file
from tests.support.processes import repo_env
from tests.support.waiting import wait_until

UNIT = ROOT / "scripts" / "deploy" / "swarm-node@.service"
INSTALLED_BINARY = "/opt/swarm-node/.venv/bin/swarm-node"  # where README tells operators to install
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def directives(text: str) -> dict[str, str]:
    """KEY=value lines of the unit (the last one wins, as in systemd); comments and sections skipped."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def local_copy(tmp_path: Path, extra: str = "") -> Path:
    """The unit with ExecStart on this checkout's environment (verify checks that the binary exists)."""
    binary = Path(sys.executable).with_name("swarm-node")
    text = UNIT.read_text()
    assert text.count(INSTALLED_BINARY) == 1
    path = tmp_path / UNIT.name
    path.write_text(text.replace(INSTALLED_BINARY, str(binary)) + extra)
    return path


def verify(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([SYSTEMD_ANALYZE, "verify", str(path)], cwd=path.parent, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit_without_a_warning(tmp_path):
    out = verify(local_copy(tmp_path))
    assert out.returncode == 0 and out.stdout + out.stderr == "", out.stdout + out.stderr
    # the same check sees a mistake (an unknown key only warns: the output must stay empty)
    bad = verify(local_copy(tmp_path, "RestartStep=5\n"))
    assert "RestartStep" in bad.stdout + bad.stderr


def test_unit_runs_join_in_its_state_directory_with_the_environment_file():
    unit = directives(UNIT.read_text())
    assert unit["ExecStart"] == f"{INSTALLED_BINARY} join --run-dir %S/swarm-node/%i"
    assert unit["StateDirectory"] == "swarm-node/%i" and unit["WorkingDirectory"] == "%S/swarm-node/%i"
    assert unit["EnvironmentFile"] == "/etc/swarm-node/%i.env"
    assert unit["Restart"] == "on-failure" and unit["KillMode"] == "mixed" and unit["KillSignal"] == "SIGTERM"
    assert int(unit["TimeoutStopSec"]) >= 120  # a SmolLM2 round with a held-out evaluation on a small CPU


def expand(text: str, state: Path, cache: Path, instance: str) -> str:
    return text.replace("%S", str(state)).replace("%C", str(cache)).replace("%i", instance)


@pytest.mark.slow
def test_the_units_command_with_the_example_environment_runs_and_stops_on_its_kill_signal(tmp_path, processes):
    unit = directives(UNIT.read_text())
    state, cache, instance = tmp_path / "lib", tmp_path / "cache", "alpha"
    run_dir = state / "swarm-node" / instance
    run_dir.mkdir(parents=True)  # StateDirectory= creates it
    command = expand(unit["ExecStart"], state, cache, instance).split()
    command[0] = str(Path(sys.executable).with_name("swarm-node"))
    environ = repo_env({**clean_environ(), **read_env_file(EXAMPLE.read_text())},
                       **dict(item.split("=", 1) for item in expand(unit["Environment"], state, cache, instance).split()))
    # the example picks SmolLM2; a tiny node on loopback exercises the same command line in seconds
    environ.update({"SWARM_NODE_PRESET": "tiny", "SWARM_NODE_SWARM__LISTEN": '["/ip4/127.0.0.1/tcp/0"]',
                    "SWARM_NODE_RUN__ROUNDS": "100000", "SWARM_NODE_RUN__THREADS": "1",
                    "SWARM_NODE_SWARM__MIN_ROUND_S": "0.2"})
    log = tmp_path / "journal.log"
    with log.open("wb") as out:
        proc = processes(command, cwd=run_dir, env=environ, stdout=out, stderr=out)
    wait_until(lambda: (run_dir / "metrics.jsonl").is_file() and (run_dir / "metrics.jsonl").read_text().count("\n")
               >= 3, "3 rounds in the state directory", procs=[proc], timeout=120, step=0.25)
    assert (run_dir / "identity.key").is_file() and (run_dir / "node.json").is_file()
    proc.send_signal(getattr(signal, unit["KillSignal"]))
    assert proc.wait(timeout=int(unit["TimeoutStopSec"])) == 0, log.read_text()[-2000:]
    assert latest_checkpoint_path(run_dir) is not None
    assert re.search(r"stopped by signal after round \d+", log.read_text())
