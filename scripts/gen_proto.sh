#!/usr/bin/env bash
# Generates Python code for proto/swarm.proto into proto/_generated/ (git-ignored) with
# grpcio-tools' protoc. Idempotent: does nothing (in ~0.1 s) when the code is already built from
# the current swarm.proto. `--force` rebuilds anyway. Importing the `proto` package does the same
# check, so running this is optional; setup.sh runs it so a broken .proto fails at setup time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "${SWARM_VENV:-.venv}/bin/python" ]; then PY="${SWARM_VENV:-.venv}/bin/python"; else PY=python3; fi
fi
# Run the file directly (not `-m proto...`): importing the package would already regenerate.
exec "$PY" proto/_codegen.py "$@"
