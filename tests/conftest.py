"""Session-wide test settings, and the fixtures most tests share: `tiny_config`, `identity` and
`processes`."""
import os
import subprocess

import pytest

from tests.support.processes import stop

# On a GPU machine with a vLLM environment, `sampling.backend = auto` would start a vLLM engine in
# every node the suite builds: the suite turns vLLM discovery off (subprocesses inherit this), and the
# vLLM tests (tests/integration/policy/test_vllm_backend.py) name their vLLM environment explicitly.
os.environ["SWARM_NODE_VLLM_PYTHON"] = ""
WARM_SOCKET: list[str | None] = []  # the fork server's socket path, set in pytest_configure


def pytest_configure(config):
    """Points the session's `python -m node.cli` children at its fork server (tests/support/warm_children.py),
    before collection: some test modules copy os.environ when imported."""
    from tests.support.warm_children import point_children_here

    WARM_SOCKET.append(point_children_here())


def pytest_unconfigure(config):
    from tests.support.warm_children import forget

    forget(WARM_SOCKET.pop() if WARM_SOCKET else None)


@pytest.fixture(scope="session", autouse=True)
def warm_children(request):
    """Where the session runs slow tests (they start `python -m node.cli` children by the dozen): the
    fork server that imports torch and the node once for all of them; None where there is none."""
    path = WARM_SOCKET[0] if WARM_SOCKET else None
    if path is None or not any(item.get_closest_marker("slow") for item in request.session.items):
        yield None
        return
    from tests.support.warm_children import serve_children

    with serve_children(path) as server:
        yield server


@pytest.fixture(scope="session")  # a plain factory: module-scoped fixtures may use it too
def tiny_config():
    """`tiny_config(*overrides)`: the tiny preset on one torch thread with `overrides` on top
    (tests/support/tiny_node.py `tiny_cfg`, the one definition; `threads=None` keeps the preset's own)."""
    from tests.support.tiny_node import tiny_cfg  # here, not at the top: tiny_node imports torch

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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups set here into node ids
def pytest_collection_modifyitems(config, items):
    """On xdist workers (scripts/test.sh runs the suite on several, `--dist loadgroup
    --no-loadscope-reorder`): a test that uses a module-scoped fixture runs on the worker of its
    module's other such tests, so the fixture is built once as in a serial run; and the slow work goes
    first (the modules with the most slow tests, then single slow tests), so the longest runs do not
    start last and leave one worker alone at the end. A serial run keeps the files' order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from _pytest.nodeid import NodeId
    grouped: dict[str, list] = {}
    for item in items:
        fixturedefs = getattr(item, "_fixtureinfo", None)
        scopes = {defs[-1].scope for defs in (fixturedefs.name2fixturedefs.values() if fixturedefs else ())}
        if scopes & {"module", "package", "class"}:
            group = item.module.__name__
            item.add_marker(pytest.mark.xdist_group(group))
            # xdist 3.8 puts the group in the node id through `item._nodeid`, which pytest 9.2 no longer
            # reads: without this, every test was its own unit and module fixtures were built twice
            item._id = NodeId.parse(f"{item.nodeid}@{group}")
            grouped.setdefault(group, []).append(item)
    slow_in_group = {g: sum(i.get_closest_marker("slow") is not None for i in members)
                     for g, members in grouped.items()}

    def weight(item) -> int:
        group = item.get_closest_marker("xdist_group")
        if group is not None:
            return slow_in_group[group.args[0]]
        return int(item.get_closest_marker("slow") is not None)

    items.sort(key=lambda item: -weight(item))  # stable: a group's tests stay together, in file order
