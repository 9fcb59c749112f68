"""Datasets whose tasks depend on Python's hash seed, and which configs need it pinned.

Some reasoning-gym generators iterate over sets of strings, so the same (seed, index) gives another
question under another PYTHONHASHSEED: peers can only agree on them if both run with hash seed 0.
Only those nodes pin it (the commands of node/commands/, through node/service/console.py): with hash randomization off, strings a peer chooses could be
made to collide in our dicts, so every other node keeps it on.
"""
from __future__ import annotations

import sys
from typing import Any, Mapping

# Measured: a different question or answer for the same (seed, index) under another PYTHONHASHSEED.
HASH_SEED_DEPENDENT = frozenset(
    {"codeio", "isomorphic_strings", "knight_swap", "list_functions",
     "polynomial_multiplication", "ransom_note", "word_ladder"}
)


def hash_randomization_off() -> bool:
    return sys.flags.hash_randomization == 0  # PYTHONHASHSEED=0 at interpreter start


def datasets_needing_fixed_hash_seed(source: str, *mixtures: Mapping[str, Any]) -> list[str]:
    """The hash-seed-dependent datasets among `mixtures` of a task source of kind `source`."""
    if source != "reasoning_gym":
        return []
    return sorted({name for mixture in mixtures for name in mixture} & HASH_SEED_DEPENDENT)
