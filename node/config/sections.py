"""The config sections that belong to a feature of the node but live here, so the config (schema.py)
imports no feature module: the feature imports its section from here (node/train/eval.py reads
EvalConfig; node/scoring/verifiers.py builds its Verifier from VerifierConfig, and so on).
Torch-free, like the whole config room."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


AnswerFormat = Literal["tagged", "lenient", "raw"]
DEFAULT_SCORER_TIMEOUT_S = 2.0


class VerifierConfig(BaseModel):
    """The `verifier` section: how a completion is scored, pure data (node/scoring/verifiers.py
    Verifier.from_config builds the scorer from it, with the same fields and digest). Frozen: the
    digest names the rewards a peer computes, so the settings never change under a running node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fmt: AnswerFormat = Field("tagged", description="answer extraction: tagged (<answer>..</answer>), lenient "
                              "(tag, else the last number) or raw (the whole completion)")
    format_weight: float = Field(default=0.0, ge=0.0, description="reward added for a well-formed answer tag")
    scorer: Literal["auto", "exact", "math", "dataset"] = Field(
        "auto", description="auto/dataset: the task source's scorer; exact / math (math-verify) compare with the "
                            "reference answer")
    timeout_s: float = Field(default=DEFAULT_SCORER_TIMEOUT_S, gt=0.0, description="wall-clock cap per scorer call")


class AllocationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scheme: Literal["off", "equal", "hardness"] = Field(
        "off", description="DARS extra rollouts for hard prompts: off, equal-treatment or hardness-weighted")
    max_rollouts: int = Field(32, ge=2, description="N_max: completions per prompt at most, base + extra")
    accuracy: Literal["measured", "posterior"] = Field(
        "measured", description="accuracy a that DARS uses: this round's base rollouts (as in the paper) or "
                                "the prompt's pass-rate posterior mean after them (pools earlier rounds)")
    posterior_decay: float = Field(0.9, gt=0, le=1, description="pass-rate posteriors forget: counts are "
                                   "multiplied by this before each new observation (1 = never forget)")


class EvalConfig(BaseModel):
    """Held-out evaluation (node/train/eval.py)."""

    model_config = ConfigDict(extra="forbid")

    every: int = Field(0, ge=0, description="rounds between held-out evaluations (after the update of every "
                                            "every-th round; metrics keys heldout_*); 0 = off")
    tasks_per_family: int = Field(16, ge=1, description="held-out tasks per family (indices 0..N-1 at a seed "
                                                        "training never uses), for each training and OOD family")
    k: int = Field(4, ge=1, description="pass@k: k completions per task at sampling.temperature (fixed seed); "
                                        "a task passes if any is correct. pass@1 is greedy")
    pass_at: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=list, description="also estimate pass@k for each of these k from max(k, every one) "
                                          "samples per task (unbiased estimator, node/train/eval.py; metrics key "
                                          "heldout_pass_at). The compute-clock testnet measures them at the budget only")
    ood: dict[str, Any] = Field(default_factory=dict,
                                description="out-of-distribution families evaluated beside the training mixture "
                                            "(never trained), same format as tasks.datasets; reported as ood:<name>. "
                                            "A preset's families belong to its tasks.source: switching the source "
                                            "without setting eval.ood leaves none")


class HintConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="ask peers for hints on prompts we fail, and answer their requests")
    anneal_threshold: float = Field(0.35, gt=0, lt=1, description="stop hinting a prompt once its unhinted "
                                    "pass-rate posterior mean exceeds this")
    request_every: int = Field(5, ge=1, description="rounds between two hint requests for the same prompt")
    max_requests_per_round: int = Field(4, ge=0, description="hint requests this node sends per round at most")
    revisits_per_round: int = Field(2, ge=0, description="hinted prompts added to each round's batch")
    max_revisits: int = Field(16, ge=1, description="extra draws of one hinted prompt per hinting episode (it is "
                              "hinted whenever drawn anyway)")
    serve_per_round: int = Field(1, ge=0, description="peers' hint requests this node answers per round "
                                 "(each may cost a generation call)")
    prefix_fraction: float = Field(0.75, gt=0, lt=1, description="share of a correct completion's characters "
                                   "a solver gives as the prefix hint (cut before the answer appears)")
    ease_threshold: float = Field(0.5, gt=0, le=1, description="hinted pass rate at which the next group of "
                                  "that prompt gets less help (previous level, shorter prefix)")
    prefix_step: float = Field(0.34, gt=0, le=1, description="share of the received prefix removed (or given "
                               "back) per step of the prefix curriculum")
    max_hint_tokens: int = Field(64, ge=8, description="tokens the model may write per abstract hint level")
    max_tracked: int = Field(4096, ge=16, description="prompts with hint state kept at most (oldest dropped)")


class WarmStartConfig(BaseModel):
    """Supervised warm start of the tiny model before RL (node/train/warm_start.py)."""

    model_config = ConfigDict(extra="forbid")

    recipe: Literal["none", "digits3"] = Field("none", description="none: RL from the initial weights; digits3: "
                                               "pre-train on a noisy corpus of the three-digit families first")
    steps: int = Field(1500, ge=1, description="optimizer steps of the warm start")
    seed: int = Field(0, description="the warm model's initial weights and corpus (one per testnet seed)")
