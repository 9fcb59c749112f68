"""One scorer sandbox worker: `python -m node.scoring.sandbox_worker`, started by node/scoring/sandbox.py.

Imports only what scoring needs (math-verify, the task source: reasoning-gym for reasoning-gym
tasks), never torch. Reads length-prefixed pickled requests `(scorer, task, answers)` on stdin and
answers on the original stdout (print() from a library goes to stderr instead) with one frame per
answer, in order, each as soon as that answer is scored: the sandbox then knows which answer hung.
Dies with its parent (PR_SET_PDEATHSIG), so a worker stuck in a C call never outlives the node.
"""
from __future__ import annotations

import os
import pickle
import struct
import sys

from policy.ground import die_with_parent

HEADER = struct.Struct("!I")
READY = "ready"


def read_frame(fd: int):
    """The next unpickled frame from `fd`, or None at end of file."""
    header = _read_exact(fd, HEADER.size)
    if header is None:
        return None
    body = _read_exact(fd, HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


def write_frame(fd: int, value) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def correctness(scorer: str, task, answer: str, source) -> float:
    from node.scoring.verifiers import _math_verify_unbounded, exact_match  # loaded by main() already

    if scorer == "exact":
        return exact_match(answer, task.reference_answer)
    if scorer == "math":
        return _math_verify_unbounded(answer, task.reference_answer)
    return source.score(task, answer)


def main() -> None:
    parent_pid = int(sys.argv[1])
    die_with_parent(parent_pid)  # the node's pid, recorded before it started us
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints must not corrupt the reply stream
    spec = read_frame(0)  # (source kind, datasets, seed) or None
    source = None
    if spec is not None:
        # the scorers load after the parent-death guard, and never in the node, which imports this
        # module for its frames (node/scoring/sandbox.py)
        from node.tasks import make_source

        source = make_source(*spec)
    from node.scoring.verifiers import _math_verify_unbounded  # (the same reason)

    # The math-verify import (about 1 s) and its first parses, which build its grammars (0.1 s,
    # far more on a busy machine): paid here, before we say we are ready, so that no honest
    # answer's deadline is spent on them.
    _math_verify_unbounded("\\frac{1}{2}", "0.5")
    write_frame(reply_fd, READY)
    while (request := read_frame(0)) is not None:
        scorer, task, answers = request  # the task is sent (and unpickled) once for all its answers
        for answer in answers:
            try:
                value = float(correctness(scorer, task, answer, source))
            except Exception:  # a scorer's error on hostile text scores 0, as in-process
                value = 0.0
            write_frame(reply_fd, value)


if __name__ == "__main__":
    main()
