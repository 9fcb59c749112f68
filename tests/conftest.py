"""Session-wide test settings."""
import os

# On a GPU machine with a vLLM environment, `sampling.backend = auto` would start a vLLM engine in
# every node the suite builds: the suite turns vLLM discovery off (subprocesses inherit this), and the
# vLLM tests (tests/test_vllm_backend.py) name their vLLM environment explicitly.
os.environ["SWARM_NODE_VLLM_PYTHON"] = ""
