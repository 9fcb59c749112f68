"""A child process that dies with its parent (Linux PR_SET_PDEATHSIG), without the startup race.

policy/vllm_backend.py starts the vLLM server with it, protocol/transports/p2pd/daemon.py the
go-libp2p daemon, node/scoring/sandbox_worker.py its scorer workers: one helper on the ground floor
(node/ground/__init__.py), stdlib only.

The race: if the parent dies after the fork but before prctl takes effect, no signal ever comes.
The child is then already reparented, so it compares getppid() with the parent pid recorded
BEFORE the fork/exec; comparing with 1 would miss it under a subreaper (systemd, tini, a
container's init), which adopts orphans under its own pid.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
ORPHANED_EXIT = 1  # the status of a child that found its parent gone (nobody is left to read it)


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """In the child (a preexec_fn, or first thing after exec): have the kernel send `sig` when the
    parent goes (on Linux: the parent THREAD that forked us), and exit at once if it already went."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(ORPHANED_EXIT)
