"""Behavior tiers at ingest (node/peers/tiers.py) with real tokenizers: the tiny preset's character
tokenizer and SmolLM2's byte-level BPE, and policy/ALGORITHMS.md numeric check 8 on that pair."""
from __future__ import annotations

import pytest
import torch

from node.train.prompts import Retokenizer
from node.peers.tiers import EXACT, NO_LOGPROBS, NO_OFFSETS, NONCANONICAL, OTHER_TOKENIZER, assign_tier
from policy.behavior import apply_alignment
from policy.generation import HFGenerator, eos_token_ids
from policy.models import ModelConfig, load_policy
from policy.types import SamplingParams
from proto import swarm_pb2


@pytest.fixture(scope="module")
def tiny():
    policy = load_policy(ModelConfig(name="tiny"))
    return policy, Retokenizer(policy, eos_token_ids(policy.model, policy.tokenizer))


@pytest.fixture(scope="module")
def smol():
    policy = load_policy(ModelConfig(name="smollm2"))
    return policy, Retokenizer(policy, eos_token_ids(policy.model, policy.tokenizer))


def completion(ids, logprobs, offsets, text, truncated):
    return swarm_pb2.Completion(text=text, token_ids=ids, behavior_logprobs=logprobs,
                                char_offsets=[x for span in offsets for x in span], truncated=truncated)


def encode(retok, text):
    return retok.encode_text(text)


def test_tier0_own_generator_output_keeps_sender_logprobs_exactly(tiny):
    """An untrained model samples special tokens mid-text too: decoding drops them, so those
    completions cannot be re-encoded to the sender's ids and fall to tier 1 (named reason)."""
    policy, retok = tiny
    gen = HFGenerator(policy.model, policy.tokenizer)
    prompt = [policy.tokenizer.bos_token_id, *policy.tokenizer("7+1=", add_special_tokens=False)["input_ids"]]
    rollouts = gen.generate([prompt], 16, SamplingParams(temperature=1.0, max_new_tokens=5, seed=3))[0]
    special = set(policy.tokenizer.all_special_ids)
    tiers = []
    for r in rollouts:
        msg = completion(r.completion_ids, r.logprobs, r.offsets, r.text, r.truncated)
        b = assign_tier(msg, policy.tokenizer_fingerprint, *encode(retok, r.text), retok)
        clean = not special & set(r.completion_ids[:-1] if not r.truncated else r.completion_ids)
        if clean:
            assert (b.tier, b.reason) == (0, EXACT)
            assert b.completion_ids == r.completion_ids  # eos kept exactly where the sender stopped
            assert b.logprobs == pytest.approx(r.logprobs, abs=1e-6)
        else:
            assert (b.tier, b.reason) == (1, NONCANONICAL)
        tiers.append(b.tier)
    assert tiers.count(0) >= 3 and any(not r.truncated for r in rollouts)


def test_tier1_smollm2_tokens_onto_tiny_characters_check8(tiny, smol):
    """SmolLM2 sender, tiny receiver: every shared character boundary keeps the sender's segment sum."""
    (_, tiny_retok), (smol_policy, smol_retok) = tiny, smol
    text = "12+345=357"
    s_ids, s_offsets = encode(smol_retok, text)
    s_logprobs = [-0.3 * (k + 1) for k in range(len(s_ids))]
    msg = completion(s_ids, s_logprobs, s_offsets, text, truncated=True)
    r_ids, r_offsets = encode(tiny_retok, text)
    b = assign_tier(msg, smol_policy.tokenizer_fingerprint, r_ids, r_offsets, tiny_retok)
    assert (b.tier, b.reason) == (1, OTHER_TOKENIZER) and b.logprobs is None
    assert len(b.completion_ids) == len(text)  # one tiny token per character
    prox = -torch.rand(len(b.completion_ids), dtype=torch.float64) * 4  # any receiver log-probs
    aligned = apply_alignment(b.alignment, prox).tolist()
    # check 8: sums over each sender token's characters equal that token's log-prob (as sent: float32)
    sent = list(msg.behavior_logprobs)
    for (start, end), lp in zip(s_offsets, sent):
        assert sum(aligned[start:end]) == pytest.approx(lp, abs=1e-9)
    assert sum(aligned) == pytest.approx(sum(sent), abs=1e-9)


def test_tier1_tiny_completion_onto_smollm2_with_eos(tiny, smol):
    (tiny_policy, tiny_retok), (_, smol_retok) = tiny, smol
    text = "5"
    ids, offsets = encode(tiny_retok, text)
    eos = tiny_policy.tokenizer.eos_token_id
    msg = completion(ids + [eos], [-0.5, -0.25], offsets + [(1, 1)], text, truncated=False)
    r_ids, r_offsets = encode(smol_retok, text)
    b = assign_tier(msg, tiny_policy.tokenizer_fingerprint, r_ids, r_offsets, smol_retok)
    assert b.tier == 1 and b.completion_ids == r_ids + [smol_retok.eos_id]
    aligned = apply_alignment(b.alignment, torch.tensor([-3.0, -1.0], dtype=torch.float64)).tolist()
    assert sum(aligned) == pytest.approx(-0.75)  # the eos joins the last segment on both sides


def test_same_tokenizer_but_noncanonical_ids_fall_to_tier1(smol):
    policy, retok = smol
    text = " hello"
    canonical, _ = encode(retok, text)
    pieces = [encode(retok, " h")[0], encode(retok, "ello")[0]]
    assert len(canonical) == 1 and all(len(p) == 1 for p in pieces)  # " hello" is one BPE token
    msg = completion(pieces[0] + pieces[1], [-1.0, -2.0], [(0, 2), (2, 6)], text, truncated=True)
    b = assign_tier(msg, policy.tokenizer_fingerprint, *encode(retok, text), retok)
    assert (b.tier, b.reason) == (1, NONCANONICAL)
    assert b.completion_ids == canonical  # we train on our own (canonical) encoding
    assert apply_alignment(b.alignment, torch.tensor([-9.0])).tolist() == pytest.approx([-3.0])


def test_tier2_without_logprobs_or_offsets(tiny):
    policy, retok = tiny
    ids, offsets = encode(retok, "42")
    bare = completion(ids, [], offsets, "42", truncated=True)
    assert assign_tier(bare, "other", ids, offsets, retok).reason == NO_LOGPROBS
    no_offsets = completion(ids, [-1.0, -1.0], [], "42", truncated=True)
    b = assign_tier(no_offsets, "other", ids, offsets, retok)
    assert (b.tier, b.reason, b.alignment) == (2, NO_OFFSETS, None)
    # the same message with our fingerprint is tier 0: offsets are only needed for alignment
    assert assign_tier(no_offsets, policy.tokenizer_fingerprint, ids, offsets, retok).tier == 0


def test_special_token_text_in_a_peer_completion_stays_text(tiny, smol):
    """A literal '<|im_end|>' (or the tiny '<eos>') in peer text must not become our eos id."""
    _, smol_retok = smol
    ids, _ = smol_retok.encode_text("a<|im_end|>b")
    assert smol_retok.eos_id not in ids and len(ids) > 3
    _, tiny_retok = tiny
    with pytest.raises(Exception):  # '<', 'e', 'o', 's', '>' are not in the tiny vocabulary: untokenizable
        tiny_retok.encode_text("5<eos>")
