"""Children die with their parent, without the startup race (policy/ground.py and its twin protocol/ground.py:
the helper that the vLLM server, the scorer workers and the p2pd daemon are started with)."""
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.waiting import wait_until

ROOT = str(Path(__file__).resolve().parents[3])
MODULES = ["policy.ground", "protocol.ground"]
ORPHANED_EXIT = 1

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def run_python(code: str, timeout_s: float = 20.0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.mark.parametrize("module", MODULES)
def test_a_child_whose_recorded_parent_is_not_its_parent_exits_at_once(module):
    not_the_parent = os.getppid()  # ours, not the child's (the child's parent is this process)
    done = run_python(f"from {module} import die_with_parent\n"
                      f"die_with_parent({not_the_parent})\nprint('survived')")
    assert done.returncode == ORPHANED_EXIT and "survived" not in done.stdout, done


@pytest.mark.parametrize("module", MODULES)
def test_a_child_of_a_live_parent_runs_on(module):
    done = run_python(f"from {module} import die_with_parent\ndie_with_parent({os.getpid()})\nprint('survived')")
    assert done.returncode == 0 and done.stdout.strip() == "survived", done


@pytest.mark.parametrize("module", MODULES)
def test_the_race_is_caught_under_a_subreaper(module):
    """The parent dies before the child asks for the signal; the orphan is adopted by a subreaper
    (as under systemd or tini), not by pid 1: a `getppid() == 1` check would let it run on."""
    done = run_python(f"""
        import ctypes, os, sys, time
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: we adopt orphans
        middle = os.fork()
        if middle == 0:
            recorded = os.getpid()
            if os.fork() == 0:
                deadline = time.monotonic() + 10
                while os.getppid() == recorded and time.monotonic() < deadline:
                    time.sleep(0.01)  # until the parent is gone: the race, made certain
                print("adopted by", os.getppid(), flush=True)
                from {module} import die_with_parent
                die_with_parent(recorded)
                os._exit(0)  # the race went unnoticed
            os._exit(0)  # the parent dies at once
        os.waitpid(middle, 0)
        _, status = os.wait()  # the orphan, ours to reap
        print("subreaper", os.getpid(), "orphan exit", os.waitstatus_to_exitcode(status))
        """)
    lines = done.stdout.split("\n")
    adopted_by = int(lines[0].split()[-1])
    subreaper, exit_code = int(lines[1].split()[1]), int(lines[1].split()[-1])
    assert adopted_by == subreaper != 1
    assert exit_code == ORPHANED_EXIT, done


@pytest.mark.parametrize("module", MODULES)
def test_the_child_gets_its_signal_when_the_parent_is_killed(module):
    """A real parent that starts a child with the helper as preexec_fn, then is SIGKILLed."""
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import functools, os, subprocess, sys, time
        from {module} import die_with_parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 preexec_fn=functools.partial(die_with_parent, os.getpid()))
        print(child.pid, flush=True)
        time.sleep(60)
        """)], env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE, text=True)
    child_pid = None
    try:
        child_pid = int(parent.stdout.readline())
        assert alive(child_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        wait_until(lambda: not alive(child_pid), "the child to die with its parent", 10, step=0.02)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child_pid is not None and alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)
        parent.stdout.close()


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
