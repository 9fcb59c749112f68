"""sampling.precision: the rollouts' behavior log-probs are the sampling copy's, the copy follows the
learner after every optimizer step, and tis(...) wraps the local objective exactly when the sampler
is not the learner (policy/sampling_copy.py, policy/backends.py, node/train/assembly.py)."""
import pytest
import torch

from node.train.assembly import build_parts, local_objective
from node.config.schema import ConfigError, LossConfig, load_config
from node.train.loop import Node
from policy.backends import make_generator
from policy.generation import HFGenerator, StaleWeightsError
from policy.learner import apply_lora
from policy.logprobs import completion_logprobs, pad_batch
from policy.models import load_policy
from policy.sampling_copy import CopySamplingGenerator, Int8Linear, SamplingCopy
from policy.settings import ModelConfig, OptimConfig
from policy.types import SamplingParams

from tests.support.tiny_node import tiny_cfg

TEMPERATURE = 0.7
QUESTIONS = ["1+2=", "345+67=", "m9=", "8+8+8+8+8="]


@pytest.fixture()
def tiny():
    return load_policy(ModelConfig(init_seed=0))


def sampled(policy, generator) -> tuple[list, torch.Tensor]:
    """12 rollouts over 3 batches, and their behavior log-probs [N, C] (0 on padding)."""
    prompts = [[policy.tokenizer.bos_token_id, *policy.tokenizer(q, add_special_tokens=False)["input_ids"]]
               for q in QUESTIONS]
    rollouts = [r for group in generator.generate(prompts, 3, SamplingParams(TEMPERATURE, 10, seed=3)) for r in group]
    width = max(len(r.logprobs) for r in rollouts)
    behavior = torch.tensor([r.logprobs + [0.0] * (width - len(r.logprobs)) for r in rollouts])  # [N, C]
    return rollouts, behavior


def recomputed(policy, model, rollouts) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [N, C] of the sampled tokens in one full forward pass of `model`, and the mask."""
    ids, mask, completion = pad_batch([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts],
                                      policy.tokenizer.pad_token_id)
    with torch.no_grad():
        logp = completion_logprobs(model, ids, mask, completion.shape[1], TEMPERATURE).float()  # [N, C]
    return logp * completion, completion.float()


def test_fp32_samples_with_the_learners_own_weights(tiny):
    generator, line = make_generator("hf", tiny, precision="fp32")
    assert type(generator) is HFGenerator and generator.model is tiny.model and generator.sampler_is_learner
    assert "sampling with the learner's weights (as configured)" in line
    rollouts, behavior = sampled(tiny, generator)
    learner, _ = recomputed(tiny, tiny.model, rollouts)
    assert (learner - behavior).abs().max() < 1e-4


def test_int8_behavior_logprobs_are_the_copys_not_the_learners(tiny):
    """Recomputed with the int8 copy they agree to float rounding; the float32 learner is measurably
    elsewhere (0.0019 nats per token on average here), so a generator that recorded the learner's
    log-probs, or sampled from the learner, would fail the first check or the second."""
    generator, line = make_generator("hf", tiny, precision="int8", max_batch=5)
    assert isinstance(generator, CopySamplingGenerator) and not generator.sampler_is_learner
    assert "int8 copy of the weights" in line
    rollouts, behavior = sampled(tiny, generator)
    copy_logp, mask = recomputed(tiny, generator.model, rollouts)
    learner, _ = recomputed(tiny, tiny.model, rollouts)
    assert (copy_logp - behavior).abs().max() < 1e-5
    assert float((learner - behavior).abs().sum() / mask.sum()) > 5e-4
    assert sum(isinstance(m, Int8Linear) for m in generator.model.modules()) == 2 * 7 + 1  # lm_head too


def test_bf16_behavior_logprobs_are_the_bf16_copys(tiny):
    """bf16 rounds differently in the cached decode than in a full forward pass (0.005 at most
    here, tests/unit/policy/test_generation.py measures SmolLM2), so the bound is looser than int8's."""
    generator, _ = make_generator("hf", tiny, precision="bf16")
    assert {p.dtype for p in generator.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in tiny.model.parameters()} == {torch.float32}  # the learner is untouched
    rollouts, behavior = sampled(tiny, generator)
    copy_logp, _ = recomputed(tiny, generator.model, rollouts)
    assert (copy_logp - behavior).abs().max() < 0.02
    # the copy's sampler measures its own entropy too (HFGenerator's TokenSampler): 16-token vocabulary
    assert all(0.0 < r.entropy <= 2.7726 for r in rollouts)


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_refresh_copies_the_learners_new_weights(tiny, precision):
    generator, _ = make_generator("hf", tiny, precision=precision)
    rollouts, _ = sampled(tiny, generator)
    before, _ = recomputed(tiny, generator.model, rollouts)
    with torch.no_grad():  # an optimizer step, as far as the copy can tell
        for p in tiny.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    stale, _ = recomputed(tiny, generator.model, rollouts)
    assert torch.equal(stale, before)  # the copy does not move by itself
    generator.refresh(7)
    assert generator.policy_version == 7 and len(generator.refresh_seconds) == 1
    fresh, mask = recomputed(tiny, generator.model, rollouts)
    rebuilt, _ = recomputed(tiny, SamplingCopy(tiny.model, precision).model, rollouts)  # a copy made now
    torch.testing.assert_close(fresh, rebuilt, atol=1e-6, rtol=0)
    assert float((before - rebuilt).abs().sum() / mask.sum()) > 0.01
    assert generator.generate([[1, 4]], 2, SamplingParams(1.0, 3))[0][0].policy_version == 7


def test_refresh_merges_lora_adapters(tiny):
    """With LoRA the learner computes base + B A; the copy samples that merged weight."""
    model = apply_lora(tiny.model, OptimConfig(lora_rank=4))
    sampling_copy = SamplingCopy(tiny.model, "bf16")
    q_proj = sampling_copy.model.model.layers[0].self_attn.q_proj
    assert type(q_proj) is torch.nn.Linear  # the LoRA wrapper is gone from the copy
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    sampling_copy.refresh()
    lora_layer = tiny.model.model.layers[0].self_attn.q_proj
    merged = lora_layer.base_layer.weight + lora_layer.get_delta_weight("default")
    torch.testing.assert_close(q_proj.weight.float(), merged.to(torch.bfloat16).float())
    assert not torch.allclose(merged, lora_layer.base_layer.weight)
    # every adapted layer gets its own merged weight (the merged weights are temporaries: a copy
    # keyed by a freed tensor's id once gave one layer another layer's weight)
    sources = dict(tiny.model.named_modules())
    adapted = [name for name, module in sampling_copy.model.named_modules()
               if hasattr(sources.get(name), "lora_A")]
    assert len(adapted) >= 4
    for name in adapted:
        lora_layer = sources[name]
        merged = lora_layer.base_layer.weight + lora_layer.get_delta_weight("default")
        copied = sampling_copy.model.get_submodule(name).weight
        torch.testing.assert_close(copied.float(), merged.to(torch.bfloat16).float(), msg=name)


def test_a_missed_refresh_of_the_copy_raises_as_before(tmp_path):
    node = Node(tiny_cfg("sampling.precision=\"int8\""), tmp_path)
    assert isinstance(node.generator, CopySamplingGenerator)
    node.run_one(2)
    assert node.generator.policy_version == node.learner.policy_version > 0
    node.learner.policy_version += 1  # an optimizer step the copy was never refreshed for
    with pytest.raises(StaleWeightsError, match=r"generator sampled with policy v\[\d+\] but the learner is at v\d+"):
        node.run_one(2)


@pytest.mark.parametrize("name, learner_samples, expected", [
    ("grpo", True, "grpo"),
    ("grpo", False, "tis(grpo)"),
    ("mc(dapo)", False, "tis(mc(dapo))"),
    ("dr_grpo", False, "tis(dr_grpo)"),
    ("minpro", False, "minpro"),  # weights by the behavior ratio already
    ("tis(grpo)", False, "tis(grpo)"),  # the config's own tis: not twice
    ("minpro", True, "minpro"),
])
def test_tis_wraps_the_local_objective_exactly_when_the_sampler_is_not_the_learner(name, learner_samples, expected):
    objective, line = local_objective(LossConfig(name=name), learner_samples)
    assert objective.spec == expected and expected in line
    assert ("tis corrects" in line) == (expected != name)


def test_tis_keeps_the_configured_knobs_inside():
    objective, _ = local_objective(LossConfig(name="dapo", knobs={"eps_high": 0.4}), False)
    assert objective.spec == "tis(dapo)" and objective.inner.eps_high == 0.4 and objective.C == 2.0


@pytest.mark.parametrize("precision, spec, tis_metrics", [("fp32", "grpo", False), ("int8", "tis(grpo)", True)])
def test_node_round_reports_the_mismatch(tmp_path, precision, spec, tis_metrics):
    parts = build_parts(tiny_cfg(f"sampling.precision=\"{precision}\"", "tasks.prompts_per_round=4"))
    assert parts.objective.spec == spec and f"local objective {spec}" in parts.backend_line
    row = Node(parts.cfg, tmp_path, parts=parts).run_one(1)
    assert row["sampler_kl"] >= 0
    if precision == "fp32":
        assert row["sampler_logp_diff"] < 1e-5
    else:
        assert row["sampler_logp_diff"] > 1e-4
    assert ("tis_weight_ess" in row and "tis_trunc_frac" in row) == tis_metrics


def test_auto_keeps_the_tiny_model_and_bf16_weights_on_their_own_weights(tiny):
    generator, line = make_generator("auto", tiny, precision="auto")
    assert generator.sampler_is_learner and "auto: a 64-wide model" in line
    generator, line = make_generator("hf", load_policy(ModelConfig(dtype="bfloat16")), precision="auto")
    assert generator.sampler_is_learner and "the learner's weights are bfloat16 already" in line


def test_bad_precision_is_a_config_error():
    with pytest.raises(ConfigError, match=r"sampling.precision: Input should be 'auto', 'fp32', 'bf16' or 'int8'"):
        load_config("tiny", None, ["sampling.precision=\"fp16\""])
    with pytest.raises(ConfigError, match=r"sampling.precision = 'int8' is the hf backend's sampling copy"):
        load_config("tiny", None, ["sampling.precision=\"int8\"", "sampling.backend=\"vllm\""])
    with pytest.raises(ValueError, match="unknown sampling precision 'fp8'"):
        make_generator("hf", load_policy(ModelConfig()), precision="fp8")
