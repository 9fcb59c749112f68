"""vLLM rollout backend for CUDA machines (`pip install 'swarm-node[vllm]'`).

vLLM is imported lazily, so this module is importable everywhere. The torch training model and the
vLLM engine are two copies of the weights on the same GPU; `refresh()` pushes the torch weights
into the engine after each optimizer step:
- the engine is started with `worker_extension_cls` naming `SwarmWeightLoader` below, so every vLLM
  worker process gains a `swarm_load_weights` method;
- `LLM.collective_rpc("swarm_load_weights", args=(named_tensors,))` runs it on every worker, which
  hands the tensors to the vLLM model's own `load_weights` (the same code that reads HF
  checkpoints, so HF parameter names work as they are);
- the prefix cache is reset, since cached KV blocks were computed with the old weights.
Tensors travel as CPU copies through vLLM's RPC serializer: fine for the small models this node
trains (SmolLM2-135M: 270 MB per refresh). For multi-GB models switch to vLLM's native weight
transfer engines (WeightTransferConfig with the "ipc" or "nccl" backend).

Behavior log-probs: vLLM's default `logprobs_mode` returns log-probs of the RAW logits (before
temperature). We start the engine with logprobs_mode="processed_logprobs", i.e. after temperature
(and top-k/top-p/penalties, all disabled here), which is log_softmax(logits / T) as policy/ALGORITHMS.md
requires. `generation_config="vllm"` keeps the model's generation_config.json (top_k, repetition
penalty...) from changing the sampling distribution.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
import torch

from policy.generation import build_rollout, eos_token_ids, validate_request
from policy.models import LoadedPolicy, load_tokenizer
from policy.types import Rollout, SamplingParams

INSTALL_HINT = "pip install 'swarm-node[vllm]' on a machine with a CUDA GPU"


def _import_vllm():
    try:
        import vllm
    except ImportError as error:
        raise RuntimeError(
            f"the vLLM backend needs vLLM ({error}); {INSTALL_HINT}, or use backend 'hf'"
        ) from error
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"the vLLM backend needs CUDA, and torch sees no GPU; {INSTALL_HINT}, or use backend 'hf'"
        )
    return vllm


class SwarmWeightLoader:
    """Mixed into each vLLM worker (via `worker_extension_cls`); `self` is the worker."""

    def swarm_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        self.model_runner.model.load_weights(weights=named_tensors)
        return len(named_tensors)


class VLLMGenerator:
    """Generator protocol on vllm.LLM.

    `source` is a LoadedPolicy (its model is exported to a temp folder for vLLM to start from and
    is the one `refresh()` syncs from) or a path / HF id (then there is no torch model and
    `refresh()` refuses). Extra keyword arguments go to `vllm.LLM`.
    """

    def __init__(
        self,
        source: LoadedPolicy | str | Path,
        *,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        **llm_options,
    ):
        vllm = _import_vllm()
        self._vllm = vllm
        self._export_dir: tempfile.TemporaryDirectory | None = None
        if isinstance(source, LoadedPolicy):
            self.model, self.tokenizer = source.model, source.tokenizer
            self._export_dir = tempfile.TemporaryDirectory(prefix="swarm-node-vllm-")
            path = self._export_dir.name
            self.model.save_pretrained(path)
            self.tokenizer.save_pretrained(path)
            # Match the torch model's precision, so behavior log-probs come from the same numerics.
            llm_options.setdefault("dtype", str(self.model.dtype).removeprefix("torch."))
        else:
            local = Path(source).expanduser()
            self.model, path = None, str(local) if local.is_dir() else str(source)
            self.tokenizer = load_tokenizer(path)
        self.eos_ids = eos_token_ids(self.model, self.tokenizer)
        self.llm = vllm.LLM(
            model=path,
            tokenizer=path,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            worker_extension_cls=f"{__name__}.SwarmWeightLoader",
            **llm_options,
        )

    def refresh(self) -> None:
        if self.model is None:
            raise RuntimeError(
                "this VLLMGenerator was built from a path, not a LoadedPolicy: it has no torch weights to sync"
            )
        named_tensors = [(name, tensor.detach().cpu()) for name, tensor in self.model.state_dict().items()]
        self.llm.collective_rpc("swarm_load_weights", args=(named_tensors,))
        self.llm.reset_prefix_cache()

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Rollout]]:
        validate_request(prompts, n, params)
        # One request per completion (n=1 each) with its own seed: reproducible without relying on
        # how a given vLLM version derives seeds for the children of an n>1 request. Prefix
        # caching makes the repeated prompts cheap.
        requests, sampling = [], []
        for index in range(len(prompts) * n):
            requests.append({"prompt_token_ids": list(prompts[index // n])})
            sampling.append(
                self._vllm.SamplingParams(
                    n=1,
                    temperature=params.temperature,
                    top_p=1.0,
                    max_tokens=params.max_new_tokens,
                    logprobs=0,  # only the sampled token's log-prob
                    seed=None if params.seed is None else params.seed + index,
                    stop_token_ids=self.eos_ids,
                )
            )
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        rollouts = []
        for index, output in enumerate(outputs):
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [step[token].logprob for token, step in zip(tokens, completion.logprobs)]
            prompt = prompts[index // n]
            rollouts.append(
                build_rollout(self.tokenizer, prompt, tokens, logprobs, self.eos_ids, params.max_new_tokens)
            )
        return [rollouts[i * n : (i + 1) * n] for i in range(len(prompts))]
