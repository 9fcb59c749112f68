"""Scoring untrusted text in killable worker processes, each answer under a deadline.

A thread cannot be stopped while a C call holds the GIL (`9**9**9**9` under math-verify, sympy's
`factorial(99999999)` in reasoning-gym's countdown scorer): the whole process freezes. Here every
call goes to a small pool of `python -m node.scoring.sandbox_worker` processes; a worker that misses the
deadline is killed (SIGKILL) and a fresh one starts at once in the background, so the answer scores
None ("score_timeout") within the deadline plus a few milliseconds. Workers are started with
subprocess (a fresh interpreter, no fork of a process that has torch threads) and die with the node.

Protocol (length-prefixed pickle frames, node/scoring/sandbox_worker.py): the worker first gets the task
source spec and answers READY once its imports are done; then each request is one frame
`(scorer, task, answers)` (a group's answers share one task, sent once) and the worker answers one
float frame per answer, in order, as soon as each is scored. Each answer has `timeout_s` of its own,
counted from the previous reply (or from the request for the first): the one that misses it is
the one that hung, it scores None, the worker is replaced, and the answers after it go to another
worker in a fresh request, so a hostile answer costs only its own slot.
"""
from __future__ import annotations

import logging
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

from policy.ground import child_env
from node.scoring.sandbox_worker import HEADER, READY, write_frame

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 2
# How long a call may wait for a worker that is still importing its scorers (first use, or right
# after a kill). This waits on the ingest worker, never on the training loop.
READY_WAIT_S = 60.0


class _Worker:
    def __init__(self, source_spec: tuple | None):
        self.proc = subprocess.Popen([sys.executable, "-m", "node.scoring.sandbox_worker", str(os.getpid())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env(), close_fds=True)
        self.ready = False
        self._buffer = b""
        write_frame(self.proc.stdin.fileno(), source_spec)

    def poll_frame(self, timeout_s: float) -> tuple[bool, Any]:
        """(True, frame) once a whole frame arrived within timeout_s, else (False, None)."""
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while True:
            if len(self._buffer) >= HEADER.size:
                size = HEADER.unpack(self._buffer[:HEADER.size])[0]
                if len(self._buffer) >= HEADER.size + size:
                    body = self._buffer[HEADER.size:HEADER.size + size]
                    self._buffer = self._buffer[HEADER.size + size:]
                    return True, pickle.loads(body)
            left = max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return False, None
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # the worker died
                raise EOFError("scorer worker exited")
            self._buffer += chunk

    def check_ready(self, timeout_s: float) -> bool:
        if not self.ready:
            got, frame = self.poll_frame(timeout_s)
            self.ready = got and frame == READY
        return self.ready

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class SandboxBusy(Exception):
    """The sandbox stayed busy with another caller's answers for longer than this caller may wait."""


class ScorerSandbox:
    """correctness(scorer, task, answer, timeout_s) in a worker process; None when it timed out.
    correctness_many does the same for several answers of one task in one round-trip."""

    def __init__(self, source_spec: tuple | None = None, workers: int = DEFAULT_WORKERS,
                 ready_wait_s: float = READY_WAIT_S):
        self.source_spec = source_spec  # (kind, datasets, seed): the worker rebuilds our task source
        self.n_workers = workers
        self.ready_wait_s = ready_wait_s
        # started / killed: workers; scored: answers; unavailable: requests that found no ready worker
        self.counters: Counter[str] = Counter()
        self._counts_lock = threading.Lock()  # _lock is held for a whole call: status must not wait on it
        self._workers: list[_Worker] = []
        self.pids_seen: list[int] = []  # every worker ever started (tests check none outlives close)
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """Start the workers now (otherwise the first call does): they take a second or two to import."""
        with self._lock:
            self._fill()

    def _fill(self) -> None:
        if self._closed:
            raise RuntimeError("the scorer sandbox was closed")
        while len(self._workers) < self.n_workers:
            self._workers.append(_Worker(self.source_spec))
            self.pids_seen.append(self._workers[-1].proc.pid)
            self._tally("started")

    def correctness(self, scorer: str, task, answer: str, timeout_s: float) -> float | None:
        return self.correctness_many(scorer, task, [answer], timeout_s)[0]

    def correctness_many(self, scorer: str, task, answers: list[str], timeout_s: float, *,
                         stop_at_timeout: bool = False, wait_s: float | None = None) -> list[float | None]:
        """One score per answer, in order; None for an answer that timed out (or found no worker).
        stop_at_timeout: the answers after one that timed out are not scored (None) either: a caller
        that refuses the whole group then waits for no replacement worker. wait_s: how long this
        caller may wait while another one's answers are being scored (None: as long as it takes);
        past it SandboxBusy is raised, and nothing was scored (the answers' senders are not to blame)."""
        answers = list(answers)
        results: list[float | None] = []
        if not self._lock.acquire(timeout=-1 if wait_s is None else max(0.0, wait_s)):
            self._tally("busy")
            raise SandboxBusy(f"the scorer sandbox was busy for {wait_s:.3g} s")
        try:
            while len(results) < len(answers):  # each pass settles at least one answer
                results.extend(self._request(scorer, task, answers[len(results):], timeout_s))
                if stop_at_timeout and None in results:
                    return results + [None] * (len(answers) - len(results))
        finally:
            self._lock.release()
        return results

    def _request(self, scorer: str, task, answers: list[str], timeout_s: float) -> list[float | None]:
        """Scores for a prefix of `answers`: all of them, or up to and including the first that
        timed out (None; its worker is replaced). Called with _lock held."""
        self._fill()
        worker = self._ready_worker()
        if worker is None:  # no worker came up within ready_wait_s: none of these can be scored
            self._tally("unavailable")  # one wait given up, however many answers it held
            return [None] * len(answers)
        results: list[float | None] = []
        try:
            write_frame(worker.proc.stdin.fileno(), (scorer, task, answers))
            for _ in answers:
                got, value = worker.poll_frame(timeout_s)
                if not got:
                    break
                results.append(value)
                self._tally("scored")
        except (OSError, EOFError) as err:
            log.warning("scorer worker %d failed (%s); starting another", worker.proc.pid, err)
        if len(results) < len(answers):  # the next answer hung (or killed its worker)
            self._replace(worker)
            self._tally("killed")
            results.append(None)
        return results

    def _tally(self, key: str) -> None:
        with self._counts_lock:
            self.counters[key] += 1

    def snapshot(self) -> dict[str, int]:
        with self._counts_lock:
            return dict(self.counters)

    def _ready_worker(self) -> _Worker | None:
        deadline = time.monotonic() + self.ready_wait_s
        while True:
            for worker in list(self._workers):
                try:
                    if worker.check_ready(0.0):
                        return worker
                except EOFError:
                    self._replace(worker)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            fds = [w.proc.stdout.fileno() for w in self._workers if not w.ready]
            select.select(fds, [], [], min(left, 0.5))

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.remove(worker)
        self._fill()

    def pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._workers]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for worker in self._workers:
                worker.kill()
            self._workers.clear()

    def __del__(self):  # a forgotten sandbox must not leave processes behind (they also die with us)
        try:
            self.close()
        except Exception:
            pass
