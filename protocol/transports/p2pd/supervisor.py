"""The p2pd transport's supervisor thread: it starts the daemon, checks it every `health_interval_s`
(process alive, IDENTIFY answered in time) and restarts it with exponential backoff when it exits
or its control socket is stuck; each run gets a reader per topic (re-subscribing every topic)."""
from __future__ import annotations

import logging
import threading
from typing import Callable

from .bounds import ConnectionBounds
from .control import ControlConnection, ControlError, identify_request
from .daemon import DaemonProcess, DaemonStartError
from .nat import Reach, nat_flags
from .reader import TopicReaders
from .relayed import RelayedGossip
from .shared import STATE_CLOSED, STATE_RESTARTING, STATE_RUNNING, Shared

log = logging.getLogger(__name__)


class Supervisor:
    """`run` is the thread's target; `ready` is set once the first daemon run listens (or failed
    to, then `start_error` says why). `loops` (target, thread name) start after that first run."""

    def __init__(self, shared: Shared, seed: bytes, readers: TopicReaders,
                 loops: list[tuple[Callable[[], None], str]], relayed: RelayedGossip) -> None:
        self.shared, self._seed, self.readers, self._loops = shared, bytes(seed), readers, loops
        self.relayed = relayed
        self.ready = threading.Event()
        self.start_error: BaseException | None = None

    def run(self) -> None:
        """Owns the daemon: the thread that starts it must outlive it (PR_SET_PDEATHSIG)."""
        s, listen = self.shared, list(self.shared.options.listen)
        try:
            self._launch(listen)
        except BaseException as err:  # noqa: BLE001 - handed to start()
            self.start_error = err
            self.ready.set()
            return
        self.ready.set()
        for target, name in self._loops:
            s.spawn(target, name)
        # After the first run, restarts reuse its real ports, so peers that know us can redial.
        announced = set(s.options.nat.announce)  # announced and relayed addresses are not ours to listen on
        reuse = [a for a in (a.split("/p2p/")[0] for a in s.listen_addrs if "/p2p-circuit" not in a)
                 if a not in announced] or listen
        while not s.stop.wait(s.options.health_interval_s):
            try:
                problem = self._health_problem()
                if problem is not None:
                    self._restart(problem, reuse)
            except Exception:  # noqa: BLE001 - a bug here must not end supervision (nor, via PDEATHSIG, the daemon)
                log.exception("p2pd supervisor error (continuing)")

    def _launch(self, listen: list[str]) -> None:
        """Starts one daemon run; on success it is the current one and its readers run."""
        s, options = self.shared, self.shared.options
        daemon = DaemonProcess(self._seed, listen=listen, expected_peer_id=s.peer_id,
                               control_timeout_s=options.control_timeout_s,
                               conn_bounds=ConnectionBounds.from_options(options),
                               nat_flags=nat_flags(options.nat, [a for a in options.bootstrap if s.peer_id not in a]))
        _, addrs = daemon.start(options.start_timeout_s)
        with s.lock:
            if s.state == STATE_CLOSED:
                daemon.stop()
                return
            s.daemon = daemon
            s.generation += 1
            generation = s.generation
            s.listen_addrs = [f"{a}/p2p/{s.peer_id}" for a in addrs]
            s.reach, s.metrics_port = Reach(), None  # a new daemon learns its reachability anew
            s.state = STATE_RUNNING
            topics = list(s.inbox)
        subscribed = [threading.Event() for _ in topics]
        for topic, event in zip(topics, subscribed):
            self.readers.spawn(topic, generation, event)
        for event in subscribed:  # so that start() returns with every topic collecting
            event.wait(options.control_timeout_s)
        try:
            self.relayed.serve(generation)
        except (ControlError, OSError) as err:  # gossip still works; relayed-only peers will not reach us
            log.warning("no stream handler for relayed peers: %s", err)
        log.info("p2pd (pid %s) runs as %s on %s", daemon.pid, s.peer_id, ", ".join(s.listen_addrs),
                 extra={"event": "daemon_started", "pid": daemon.pid, "generation": generation,
                        "restarts": s.stats["daemon_restarts"], "listen_addrs": list(s.listen_addrs)})

    def _health_problem(self) -> str | None:
        s = self.shared
        daemon = s.daemon
        if daemon is None or s.stop.is_set():
            return None
        if not daemon.alive():
            return f"p2pd (pid {daemon.pid}) exited with code {daemon.proc.returncode}"
        try:
            with ControlConnection(daemon.socket_path, s.options.control_timeout_s) as conn:
                conn.request(identify_request())
        except ControlError as err:
            return f"p2pd (pid {daemon.pid}) control socket is stuck or broken ({err})"
        return None

    def _restart(self, problem: str, reuse: list[str]) -> None:
        s = self.shared
        old = s.daemon
        tail = old.stderr_tail() if old else ""
        with s.lock:
            if s.state == STATE_CLOSED:
                return
            s.state = STATE_RESTARTING
            s.stats["daemon_restarts"] += 1
            restarts = s.stats["daemon_restarts"]
            subscriptions = list(s.subscriptions.values())
            s.subscriptions.clear()
        log.error("%s; restarting it. stderr tail:\n%s", problem, tail or "(empty)",
                  extra={"event": "daemon_restart", "reason": problem, "pid": old.pid if old else None,
                         "restarts": restarts, "stderr_tail": tail})
        for conn in subscriptions:
            conn.close()
        if old is not None:
            old.stop()
        self._relaunch(reuse)

    def _relaunch(self, reuse: list[str]) -> None:
        """Launches until one run starts or the transport closes, backing off (doubling) between tries."""
        s = self.shared
        delay, listen = s.options.backoff_initial_s, reuse
        while not s.stop.is_set():
            try:
                self._launch(listen)
                return
            except DaemonStartError as err:
                s.bump("daemon_failures")
                log.error("p2pd restart failed (retrying in %.1f s): %s", delay, err,
                          extra={"event": "daemon_restart_failed", "retry_in_s": delay, "error": str(err)})
                listen = list(s.options.listen)  # our old ports may be taken: fall back to the configured ones
            if s.stop.wait(delay):
                return
            delay = min(2 * delay, s.options.backoff_max_s)
