"""Model loading: the tiny tokenizer and model, local folders, clear errors, and SmolLM2 from the
offline GGUF with its bf16 conversion cache (slow)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from policy.models import (
    CONVERSION_RECORD,
    SMOLLM2_CACHE_FOLDER,
    ModelConfig,
    ModelNotFoundError,
    load_policy,
    resolve_cache_dir,
    tokenizer_fingerprint,
)
from policy.tiny_tokenizer import CHARACTERS, build_tiny_tokenizer
from tests.unit.policy.test_generation import smollm2_cache

# Golden fingerprints: a change means peers with the old code would no longer count as sharing
# our tokenizer (tier 0 in policy/ALGORITHMS.md) -- bump only on purpose.
TINY_FINGERPRINT = "6c4f3104dae25e3c"
SMOLLM2_FINGERPRINT = "8f427c68dde41dab"


# --- tiny tokenizer ---------------------------------------------------------------------------


def test_tiny_tokenizer_vocab_and_special_ids():
    tokenizer = build_tiny_tokenizer()
    assert len(tokenizer) == 16
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.bos_token == "<bos>"
    assert [tokenizer.convert_tokens_to_ids(c) for c in CHARACTERS] == list(range(3, 16))
    assert tokenizer.chat_template is None


def test_tiny_tokenizer_round_trip_offsets_and_no_auto_bos():
    tokenizer = build_tiny_tokenizer()
    text = "12+34=m46"
    encoding = tokenizer(text, return_offsets_mapping=True)
    assert len(encoding["input_ids"]) == len(text)  # one token per character, no bos added
    assert tokenizer.bos_token_id not in encoding["input_ids"]
    assert encoding["offset_mapping"] == [(i, i + 1) for i in range(len(text))]
    assert tokenizer.decode(encoding["input_ids"]) == text
    with_specials = [tokenizer.bos_token_id, *encoding["input_ids"], tokenizer.eos_token_id]
    assert tokenizer.decode(with_specials, skip_special_tokens=True) == text
    assert tokenizer.encode("<bos>7=<eos>") == [1, 10, 14, 2]  # special tokens parse whole


def test_tiny_tokenizer_rejects_unknown_characters():
    with pytest.raises(Exception, match="UNK"):
        build_tiny_tokenizer().encode("1 + 2")


def test_fingerprint_is_stable():
    assert tokenizer_fingerprint(build_tiny_tokenizer()) == TINY_FINGERPRINT
    tokenizer = build_tiny_tokenizer()
    tokenizer(["1", "22"], padding=True, truncation=True, max_length=4)  # mutates backend state
    assert tokenizer_fingerprint(tokenizer) == TINY_FINGERPRINT


# --- tiny model -------------------------------------------------------------------------------


def test_model_config_rejects_unknown_fields():
    with pytest.raises(ValidationError):
        ModelConfig(nmae="tiny")


def test_tiny_model_is_a_function_of_init_seed():
    global_state = torch.random.get_rng_state()
    first = load_policy(ModelConfig(init_seed=3)).model.state_dict()
    again = load_policy(ModelConfig(init_seed=3)).model.state_dict()
    other = load_policy(ModelConfig(init_seed=4)).model.state_dict()
    assert torch.equal(torch.random.get_rng_state(), global_state)  # caller's RNG untouched
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not all(torch.equal(first[name], other[name]) for name in first)


def test_tiny_policy_fields():
    policy = load_policy(ModelConfig())
    config = policy.model.config
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (16, 64, 2)
    assert config.tie_word_embeddings and config.intermediate_size == 256
    assert policy.model.generation_config.eos_token_id == policy.tokenizer.eos_token_id == 2
    assert policy.model.generation_config.pad_token_id == 0
    assert policy.name == "tiny" and policy.chat is False
    assert policy.tokenizer_fingerprint == TINY_FINGERPRINT
    assert policy.model.dtype == torch.float32
    assert load_policy(ModelConfig(dtype="bfloat16")).model.dtype == torch.bfloat16


def test_tiny_forward_backward_takes_milliseconds():
    model = load_policy(ModelConfig()).model
    input_ids = torch.randint(3, 16, (8, 32))  # [B, T]

    def step() -> float:
        started = time.perf_counter()
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        return time.perf_counter() - started

    for _ in range(3):  # warm-up: the first few backward passes of a process take ~0.8 s here
        step()
    fastest = min(step() for _ in range(5))  # min: robust to noisy neighbours on shared CPUs
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert fastest < 0.1, f"tiny fwd+bwd took {fastest * 1000:.0f} ms"


# --- other names ------------------------------------------------------------------------------


def test_local_directory_loads(tmp_path):
    policy = load_policy(ModelConfig(init_seed=7))
    policy.model.save_pretrained(tmp_path)
    policy.tokenizer.save_pretrained(tmp_path)
    loaded = load_policy(ModelConfig(name=str(tmp_path)))
    assert loaded.tokenizer_fingerprint == policy.tokenizer_fingerprint
    reference = policy.model.state_dict()
    assert all(torch.equal(tensor, reference[name]) for name, tensor in loaded.model.state_dict().items())


def test_hugging_face_id_loads_from_the_local_cache_only(tmp_path, monkeypatch):
    # A hub-cache layout built by hand: models--org--name/{refs/main, snapshots/<commit>/...}.
    repo = tmp_path / "models--local-org--tiny-copy"
    snapshot = repo / "snapshots" / ("0" * 40)
    policy = load_policy(ModelConfig(init_seed=5))
    policy.model.save_pretrained(snapshot)
    policy.tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr("policy.models.HF_HUB_CACHE", str(tmp_path))
    loaded = load_policy(ModelConfig(name="local-org/tiny-copy"))
    assert loaded.tokenizer_fingerprint == TINY_FINGERPRINT
    assert torch.equal(loaded.model.lm_head.weight, policy.model.lm_head.weight)


def test_model_not_found_error_names_what_was_tried(tmp_path):
    with pytest.raises(ModelNotFoundError) as missing:
        load_policy(ModelConfig(name="no-such-org/no-such-model"))
    message = str(missing.value)
    for expected in ("'tiny'", "'smollm2'", "local directory", "no-such-org/no-such-model", "Hugging Face", "model.name=tiny"):
        assert expected in message
    assert isinstance(missing.value, ValueError)

    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        load_policy(ModelConfig(name=str(tmp_path)))  # an existing folder that is not a model


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path / "env"))
    assert resolve_cache_dir(ModelConfig()) == tmp_path / "env"
    assert resolve_cache_dir(ModelConfig(cache_dir=str(tmp_path / "explicit"))) == tmp_path / "explicit"
    monkeypatch.delenv("SWARM_NODE_CACHE")
    assert resolve_cache_dir(ModelConfig()).parts[-2:] == (".cache", "swarm-node")


# --- SmolLM2 (slow: the first load of a session converts the GGUF) -----------------------------




@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    return load_policy(ModelConfig(name="smollm2", dtype="bfloat16", cache_dir=smollm2_cache(tmp_path_factory)))


@pytest.mark.slow
def test_smollm2_conversion_is_cached(smollm2, tmp_path_factory):
    folder = Path(smollm2_cache(tmp_path_factory)) / SMOLLM2_CACHE_FOLDER
    assert (folder / "model.safetensors").is_file() and (folder / "chat_template.jinja").is_file()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left
    conversion_seconds = json.loads((folder / CONVERSION_RECORD).read_text())["seconds"]

    started = time.perf_counter()
    cached = load_policy(ModelConfig(name="smollm2", dtype="bfloat16", cache_dir=str(folder.parent)))
    cached_seconds = time.perf_counter() - started
    print(f"smollm2: conversion {conversion_seconds:.1f} s, cached load {cached_seconds:.1f} s")
    assert cached_seconds < conversion_seconds / 3
    assert cached.tokenizer_fingerprint == smollm2.tokenizer_fingerprint
    assert all(torch.equal(a, b) for a, b in zip(cached.model.parameters(), smollm2.model.parameters()))


@pytest.mark.slow
def test_smollm2_answer_styles_change_only_the_system_prompt(smollm2):
    from node.scoring.verifiers import SYSTEM_PROMPTS
    from node.train.prompts import Retokenizer, render_prompt

    question = "Calculate 5 - 3."
    think = render_prompt(smollm2, question)
    direct = render_prompt(smollm2, question, system_prompt=SYSTEM_PROMPTS["direct"])
    text = smollm2.tokenizer.decode(direct)
    assert SYSTEM_PROMPTS["direct"] in text and SYSTEM_PROMPTS["think"] not in text and question in text
    assert len(direct) < len(think)
    assert Retokenizer(smollm2, [0], SYSTEM_PROMPTS["direct"]).prompt(question) == direct


@pytest.mark.slow
def test_smollm2_policy_fields(smollm2):
    assert smollm2.chat is True
    assert smollm2.model.dtype == torch.bfloat16
    assert smollm2.model.config.vocab_size == 49152
    assert smollm2.tokenizer_fingerprint == SMOLLM2_FINGERPRINT != TINY_FINGERPRINT
    assert smollm2.tokenizer.pad_token_id is not None


@pytest.mark.slow
def test_smollm2_answers_7_plus_5(smollm2):
    tokenizer = smollm2.tokenizer
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 7 + 5?"}], tokenize=False, add_generation_prompt=True
    )
    input_ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]  # [1, P]
    with torch.no_grad():
        # 48 tokens: the greedy wording depends on the CPU's bf16 kernels (on a CPU with native
        # AVX512-BF16 / AMX it explains the order of operations first, then says 7 + 5 = 12)
        output = smollm2.model.generate(input_ids=input_ids, max_new_tokens=48, do_sample=False)
    answer = tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True)
    assert "12" in answer, answer
