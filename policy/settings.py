"""The policy's configuration sections (model, optimizer, off-policy correction) and the error a
model that cannot be loaded ends in. Pydantic only, no torch: the node's config (node/config/schema.py)
validates, lists and explains them without loading torch; policy/models.py and
policy/learner.py act on them."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ModelNotFoundError(ValueError):
    """No source could load the requested model; the message lists what was tried."""


class ModelConfig(BaseModel):
    """Which policy to load. hidden_size / num_layers / num_heads / init_seed shape the "tiny"
    model only; pretrained models keep their own architecture."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("tiny", description="tiny | smollm2 | a local model directory | an HF id already in the "
                      "local HF cache (nothing is downloaded)")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="weights' dtype (float32 masters + "
                                                  "optim.autocast_bf16 keep small learning rates alive)")
    hidden_size: int = Field(64, description="tiny only: width")
    num_layers: int = Field(2, description="tiny only: layers")
    num_heads: int = Field(4, description="tiny only: attention heads")
    init_seed: int = Field(0, description="tiny only: the initial weights are a function of this seed")
    cache_dir: str | None = Field(None, description="converted models (smollm2); default $SWARM_NODE_CACHE or "
                                  "~/.cache/swarm-node")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where the policy lives and trains; auto = "
                                                   "cuda when torch sees a GPU, else cpu")


class OptimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-3, ge=0, description="AdamW learning rate; 0 freezes the weights while every update "
                      "still runs (the testnet's --frozen-peers: peers that keep a learner's pace, never learning)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    grad_clip: float = Field(1.0, gt=0, description="max gradient norm per optimizer step")
    epochs: int = Field(1, ge=1, description="passes over each round's batch (ratios leave 1 after the first step)")
    minibatches: int = Field(1, ge=1, description="optimizer steps per epoch")
    autocast_bf16: bool | Literal["auto"] = Field(
        False, description="bf16 autocast for forward passes; auto = only where bf16 is native (a GPU that "
                           "supports it, or a CPU with AVX512-BF16 / AMX: elsewhere it is several times slower)")
    skip_zero_advantage: bool = Field(True, description="drop groups whose advantages are all 0 (no signal)")
    backward_chunk_tokens: int = Field(1024, ge=0, description="a minibatch above this many tokens (rows x padded "
                                       "length) backpropagates in row chunks of at most this size: the same "
                                       "gradient with bounded activation memory (an objective that filters rows, "
                                       "ftis, pays one extra no-grad forward pass for it); 0 = never chunk")
    shared_prefix: bool = Field(True, description="run each group's prompt once and its G completions against "
                                "the prompt's key/value cache (the gradient sums over them), instead of the whole "
                                "prompt + completion row per sample: the same log-probs and gradient to float "
                                "rounding (tests/unit/policy/test_shared_prefix.py), less compute; rows with a "
                                "prompt of their own take the plain path")
    lora_rank: int = Field(0, ge=0, description="0 = full fine-tuning; > 0 wraps the model with peft LoRA")
    lora_alpha: int = Field(16, description="LoRA scaling")
    lora_targets: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
                                    description="modules LoRA wraps")


class OffPolicyConfig(BaseModel):
    """How peers' samples are corrected (policy/ALGORITHMS.md, "Shared rollouts"), and a control that
    drops this node's own failures as peers' are dropped."""

    model_config = ConfigDict(extra="forbid")

    # The defaults are the treatment that won docs/testnets-and-experiments.md "The swarm against the silo"
    # (scripts/experiments/skeptic.py): peers' successes at ratio 1 (an importance ratio to the sender mutes exactly
    # the rare successes sharing is for), their failures not trained (pushing down completions we would not write
    # collapsed nodes onto their modes).
    sender_logprobs: bool = Field(False, description="use peers' behavior log-probs (tiers 0/1: minpro etc. "
                                  "correct for the sender's policy); false treats every peer sample as tier 2, i.e. "
                                  "on-policy with ratio 1 as SAPO does")
    proximal: Literal["receiver", "behavior"] = Field(
        "receiver", description="l^old of peers' samples: this node's log-probs at the start of the update, or "
                                "the behavior log-probs (then grpo/dapo clip the ratio to the sampler, as PPO does "
                                "with stale data)")
    peer_failures: Literal["train", "drop"] = Field(
        "drop", description="drop: a peer's sample trains only if our verifier found it correct and its advantage "
                             "(over the whole group) is >= 0; its other samples are not forwarded, yet count in the "
                             "loss's denominators as at advantage 0, and a peer's group without a correct sample is "
                             "skipped (only its successes teach us: pushing down completions our policy would not "
                             "write sharpened it onto its own modes, policy/ALGORITHMS.md)")
    own_failures: Literal["train", "drop"] = Field(
        "train", description="drop: this node's own samples are dropped exactly as peer_failures = drop drops a "
                             "peer's (only correct ones with advantage >= 0 train; an own group without a correct "
                             "sample is skipped). The tiny-warm preset's choice (it won there, alone and in a swarm: "
                             "docs/testnets-and-experiments.md \"The swarm against the silo\"); beside a silo that "
                             "trains its failures it is the positive-only control")
    neg_damping: float = Field(
        0.5, ge=0.0, le=1.0, description="kappa_neg: a peer's sample below its group's mean reward counts with "
                                         "this weight, in the baseline too (the group sums to 0); one weight for "
                                         "every tier, so shipping log-probs buys no advantage")

    @field_validator("neg_damping", mode="before")
    @classmethod
    def _one_damping(cls, value):
        if isinstance(value, (list, tuple)):
            raise ValueError(f"neg_damping is one weight for every tier now, not {list(value)}: a per-tier damping "
                             "let a sender weigh more by shipping log-probs (policy/ALGORITHMS.md, \"What a "
                             "peer's claims can buy\"); set one number, e.g. neg_damping = 0.5")
        return value
