"""The command line's process state, shared by node/cli.py and the commands it runs (the testnet's
too): the one stderr console, and whether this process may restart itself (only when `swarm-node`
runs as the process entry point, never when a test or a script calls `main(argv)`)."""
from __future__ import annotations

import os
import sys

from rich.console import Console

from node.observe.logs import say
from node.tasks import hash_seed

console = Console(stderr=True)
_may_reexec = False


def allow_reexec(allowed: bool) -> None:
    """Set by node/cli.py's main(): True when it runs as the process entry point."""
    global _may_reexec
    _may_reexec = allowed


def pin_hash_seed_if_needed(cfg) -> None:
    """Restart this process with PYTHONHASHSEED=0 when its tasks need it (node/tasks/hash_seed.py),
    before any model or dataset is loaded; every other node keeps hash randomization on. (The module's
    functions are looked up at the call: tests replace hash_randomization_off.)"""
    names = hash_seed.datasets_needing_fixed_hash_seed(cfg.tasks.source, cfg.tasks.datasets, cfg.eval.ood)
    if names and _may_reexec and not hash_seed.hash_randomization_off():
        say(console, f"{', '.join(names)}: tasks depend on Python's hash seed; restarting with PYTHONHASHSEED=0",
            "reexec", datasets=names)
        os.execve(sys.executable, [sys.executable, "-m", "node.cli", *sys.argv[1:]],
                  {**os.environ, "PYTHONHASHSEED": "0"})
