"""A graceful stop on SIGTERM / SIGINT: finish the round in progress, checkpoint it, exit 0.

systemd (`systemctl stop`, a reboot), `docker stop` and Ctrl-C all send one of these. Python's
default SIGTERM ends the process at once, losing every round since the last periodic checkpoint;
an update cannot be cut off halfway either (the weights would be half a round). So the first signal
only asks the round loop to stop after the current round (node/train/loop.py checkpoints it then); a
second one stops at once (KeyboardInterrupt: cleanup still runs, the rounds since the last
checkpoint are lost), for an operator who cannot wait for a long round.
"""
from __future__ import annotations

import os
import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopOnSignals:
    """`with StopOnSignals() as stop:` -> `stop` (a threading.Event) is set by the first signal.
    Handlers can only be installed in the main thread: elsewhere (a test running a node in a
    thread) the event simply never fires and nothing is changed."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._previous: dict[int, object] = {}

    def __enter__(self) -> threading.Event:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self.event

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        if self.event.is_set():
            raise KeyboardInterrupt(f"second {name}: stopping now")
        self.event.set()
        # os.write, not print: a handler that prints while the main thread is printing raises
        os.write(2, f"{name}: stopping after the round in progress (then a checkpoint); "
                    f"send it again to stop now and lose the rounds since the last checkpoint\n".encode())
