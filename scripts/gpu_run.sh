#!/usr/bin/env bash
# The swarm against the silo on SmolLM2, sized for one CUDA GPU: 4-node memory testnets, 8/0 vs 4/4 on
# paired seeds, all at once, within 8 minutes; per-phase seconds of every round (scripts/experiments/gpu_run.py).
#   scripts/gpu_run.sh            # on a CUDA machine (writes runs/gpu_run/gpu_run.json + .png)
#   scripts/gpu_run.sh --smoke    # anywhere, in seconds (tiny preset)
# Installs nothing: it runs with the project's environment (.venv, or $PYTHON, else python3) and needs
# neither hivemind nor grpcio-tools there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "${SWARM_VENV:-.venv}/bin/python" ]; then PY="${SWARM_VENV:-.venv}/bin/python"; else PY=python3; fi
fi
exec "$PY" -m scripts.experiments.gpu_run "$@"
