"""tests/support/waiting.py's wait_until, the suite's one wait: it returns what the predicate returned, fails
after its timeout, and fails at once when a process the wait depends on has exited."""
import subprocess
import sys
import time

import pytest

from tests.support.waiting import wait_until


def test_wait_until_returns_the_value_and_fails_on_timeout_or_at_once_on_an_exited_process():
    calls = []
    assert wait_until(lambda: calls.append(1) or (len(calls) == 3 and "ready"), "a third call", step=0.001) == "ready"
    assert len(calls) == 3  # polled until truthy, not once more

    started = time.monotonic()
    with pytest.raises(AssertionError, match="timed out after 0.2 s waiting for nothing"):
        wait_until(lambda: None, "nothing", timeout=0.2, step=0.01)
    assert 0.2 <= time.monotonic() - started < 5

    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    exited.wait(timeout=30)
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"a process exited \(3\) while waiting for its answer"):
        wait_until(lambda: False, "its answer", timeout=60, procs=[exited])
    assert time.monotonic() - started < 1  # at once, not after the 60 s
