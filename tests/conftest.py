"""Session-wide test settings, and the fixtures most tests share: `tiny_config`, `identity` and
`processes`."""
import os
import subprocess

import pytest

from processes import stop

# On a GPU machine with a vLLM environment, `sampling.backend = auto` would start a vLLM engine in
# every node the suite builds: the suite turns vLLM discovery off (subprocesses inherit this), and the
# vLLM tests (tests/test_vllm_backend.py) name their vLLM environment explicitly.
os.environ["SWARM_NODE_VLLM_PYTHON"] = ""


@pytest.fixture(scope="session")  # a plain factory: module-scoped fixtures may use it too
def tiny_config():
    """`tiny_config(*overrides)`: the tiny preset on one torch thread with `overrides` on top
    (tests/tiny_node.py `tiny_cfg`, the one definition; `threads=None` keeps the preset's own)."""
    from tiny_node import tiny_cfg  # here, not at the top: tiny_node imports torch

    return tiny_cfg


@pytest.fixture(scope="session")  # a plain factory: module-scoped fixtures may use it too
def identity():
    """`identity()`: a fresh NodeIdentity (a new key) at each call."""
    from protocol import NodeIdentity

    return NodeIdentity.generate


@pytest.fixture
def processes():
    """`processes(args, **kwargs)`: subprocess.Popen, and every process started through it that is
    still running at teardown is ended (SIGTERM, then SIGKILL), by its handle only."""
    started: list[subprocess.Popen] = []

    def popen(*args, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(*args, **kwargs)
        started.append(proc)
        return proc

    yield popen
    stop(started)
