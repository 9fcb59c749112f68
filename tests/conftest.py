"""Session-wide test settings."""
import os

# `sampling.backend = auto` would start a vLLM engine in every node whose config leaves the backend
# to auto, whenever .venv-vllm exists: the suite pins HF (subprocesses inherit this), and the vLLM
# tests (tests/test_vllm_backend.py) name their vLLM environment explicitly.
os.environ["SWARM_NODE_VLLM_PYTHON"] = ""
