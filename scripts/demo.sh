#!/usr/bin/env bash
# The main job on embedded defaults: train the tiny preset locally, then plot the run.
# Each call trains a fresh run in its own directory (RUN_DIR overrides it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
run_dir=${RUN_DIR:-runs/demo-$(date +%Y%m%d-%H%M%S)}
.venv/bin/swarm-node train --preset tiny --run-dir "$run_dir" "$@"
.venv/bin/swarm-node report "$run_dir"
