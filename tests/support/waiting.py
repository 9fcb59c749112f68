"""The suite's one way to wait: poll a condition until it holds, with a deadline, and fail the
test the same way everywhere (an AssertionError naming what was awaited). Every network wait in a
test goes through here, so no test blocks forever on a peer."""
from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], what: str, timeout: float = 15.0, *,
               procs: Iterable[subprocess.Popen] = (), step: float = 0.05) -> T:
    """Polls `predicate` every `step` s until it returns something truthy, and returns that. Fails
    after `timeout` s, or at once when one of `procs` (processes the wait depends on) has exited."""
    deadline = time.monotonic() + timeout
    procs = list(procs)
    while True:
        value = predicate()
        if value:
            return value
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"a process exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(step)
