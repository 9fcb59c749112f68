"""A node's parts, built once: the first step of the one assembly (node/service/assembly.py
assemble_node, which builds the rest on a floor that may see peers/).

    cfg -> NodeParts (policy, trainable model, objective, task source, verifier, generator,
           retokenizer, pass rates, one SamplingContext)
        -> the exchange (node/service/assembly.py build_exchange), from the parts
        -> the Node (node/train/loop.py), from the parts and the exchange

The exchange and the Node share these objects instead of reaching into each other: the exchange
never needs a Node, and a Node gets its exchange in its constructor, never by assignment.
"""
from __future__ import annotations

import contextlib
import json
import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager

import numpy as np
import torch

from node.config.schema import LossConfig, NodeConfig
from node.train.pass_rates import PassRates
from node.train.prompts import Retokenizer, render_prompt
from node.tasks import make_source
from node.tasks.base import TaskSource
from node.scoring.verifiers import SYSTEM_PROMPTS, Verifier
from node.train.warm_start import warm_model_config
from policy.backends import make_generator
from policy.checkpoint import latest_checkpoint_path
from policy.generation import Generator, eos_token_ids
from policy.learner import apply_lora
from policy.losses import Objective, make_objective
from policy.models import LoadedPolicy, load_policy
from policy.precision import autocast_context
from policy.types import SamplingParams

log = logging.getLogger(__name__)

WORK_KEYS = ("generate_calls", "generate_steps", "generate_prompts",
             "hint_generate_calls", "hint_generate_steps", "hint_generate_prompts", "hint_tokens_generated")
EXCHANGE_STATE = "exchange.json"  # in each checkpoint: the exchange's admission state (node/peers/admission.py)


@dataclass
class SamplingContext:
    """What the rollout sampler, the hint writer and the evaluator sample and score with. One object
    for the three, so swapping the backend (benchmarks force full-length sampling) is one assignment."""

    policy: LoadedPolicy
    generator: Generator
    verifier: Verifier
    source: TaskSource  # the training mixture (and its scorers)
    params: SamplingParams  # the node's temperature and max_new_tokens
    autocast: Callable[[], ContextManager]  # bf16 autocast when optim.autocast_bf16 and the learner's
    # weights sample; a no-op for a sampling copy (it has its own precision) and vLLM
    system_prompt: str  # sampling.answer_style's instructions (SYSTEM_PROMPTS)
    # generation work since the last take_work(): what the compute clock charges (node/testnet/clock.py)
    work: Counter = field(default_factory=Counter)

    def prompt(self, question: str, hint: str | None = None) -> list[int]:
        """The token ids this node samples `question` with (and scores and trains a peer's answer under)."""
        return render_prompt(self.policy, question, hint, self.system_prompt)

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams, *,
                 for_peers: bool = False) -> list[list]:
        """The generator's completions, counted as this node's work: calls (python, set-up), decode
        steps (an HF generator's batch of up to max_batch rows runs as many as its longest
        completion needs), prompts prefilled (distinct ones, per batch) and, for peers (hint
        writing), the tokens generated. A generator that reports no work (vLLM) counts as one batch:
        its distinct prompts and its longest completion. The held-out evaluation calls the generator
        directly: the measuring instrument is not charged."""
        reported = getattr(self.generator, "work", None)
        before = Counter(reported) if reported is not None else None
        out = self.generator.generate(prompts, n, params)
        done = reported - before if before is not None else Counter(
            decode_steps=max((len(r.completion_ids) for rs in out for r in rs), default=0),
            prompts_prefilled=len({tuple(p) for p in prompts}))
        prefix = "hint_" if for_peers else ""
        self.work[prefix + "generate_calls"] += 1
        self.work[prefix + "generate_steps"] += done["decode_steps"]
        self.work[prefix + "generate_prompts"] += done["prompts_prefilled"]
        if for_peers:
            self.work["hint_tokens_generated"] += sum(len(r.completion_ids) for rs in out for r in rs)
        return out

    def take_work(self) -> dict[str, float]:
        """The counts since the last call (then zero), with every key present."""
        counts = {key: float(self.work.get(key, 0)) for key in WORK_KEYS}
        self.work.clear()
        return counts


@dataclass
class NodeParts:
    """Everything a Node and its exchange are built from (module docstring)."""

    cfg: NodeConfig
    policy: LoadedPolicy
    model: torch.nn.Module  # policy.model, LoRA-wrapped when optim.lora_rank > 0
    objective: Objective
    source: TaskSource
    verifier: Verifier
    backend_line: str  # what the rollout backend and the local objective are, and why, for the console
    retokenizer: Retokenizer
    pass_rates: PassRates
    sampling: SamplingContext

    @property
    def generator(self) -> Generator:
        return self.sampling.generator


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_parts(cfg: NodeConfig) -> NodeParts:
    """Seeds the RNGs, loads the policy (warm-started when configured) and builds the rest from it."""
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    seed_everything(cfg.run.seed)
    policy = load_policy(warm_model_config(cfg.warm, cfg.model))
    model = apply_lora(policy.model, cfg.optim)
    source = make_source(cfg.tasks.source, cfg.tasks.datasets, cfg.tasks.seed, cfg.tasks.peer_seeds,
                         cfg.tasks.heldout_split)
    generator, backend_line = make_generator(cfg.sampling.backend, policy, precision=cfg.sampling.precision)
    objective, objective_line = local_objective(cfg.loss, generator.sampler_is_learner)
    params = SamplingParams(temperature=cfg.sampling.temperature, max_new_tokens=cfg.sampling.max_new_tokens)
    device = next(model.parameters()).device
    autocast = ((lambda: autocast_context(cfg.optim.autocast_bf16, device)) if generator.sampler_is_learner
                else contextlib.nullcontext)
    system_prompt = SYSTEM_PROMPTS[cfg.sampling.answer_style]
    verifier = Verifier.from_config(cfg.verifier)
    sampling = SamplingContext(policy, generator, verifier, source, params, autocast, system_prompt)
    return NodeParts(cfg=cfg, policy=policy, model=model, objective=objective,
                     source=source, verifier=verifier, backend_line=f"{backend_line}; {objective_line}",
                     retokenizer=Retokenizer(policy, eos_token_ids(policy.model, policy.tokenizer), system_prompt),
                     pass_rates=PassRates(cfg.allocation.posterior_decay), sampling=sampling)


def local_objective(loss: LossConfig, sampler_is_learner: bool) -> tuple[Objective, str]:
    """The objective for this node's own samples, and a line saying what it is and why.

    When the rollouts were sampled by something other than the learner's own forward pass (a
    lower-precision copy, vLLM), their behavior log-probs b differ from the learner's l^old and the
    update is off-policy by that mismatch: loss.name is then wrapped in tis(...) (its default C = 2,
    token level), unless it already weights its term by the behavior ratio (cispo, minpro, prefix,
    ftis, or a tis(...) the config wrote), which corrects the same mismatch."""
    objective = make_objective(loss.name, **loss.knobs)
    if sampler_is_learner:
        return objective, f"local objective {objective.spec}"
    if objective.uses_behavior_ratio:
        return objective, (f"local objective {objective.spec}: it weights by the behavior ratio, which corrects "
                           "the sampler's mismatch to the learner")
    wrapped = make_objective(f"tis({loss.name})", inner=dict(loss.knobs))
    return wrapped, (f"local objective {wrapped.spec}: the sampler is not the learner, tis corrects its "
                     "mismatch (policy/ALGORITHMS.md)")


def saved_exchange_state(run_dir: Path) -> dict | None:
    """The exchange state saved with the newest checkpoint in run_dir (the one `Node.resume` loads);
    None (with a warning when it should have been there) if there is none or it cannot be read: the
    exchange then starts empty, as a new node's would."""
    checkpoint = latest_checkpoint_path(run_dir)
    if checkpoint is None:
        return None
    path = checkpoint / EXCHANGE_STATE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        log.warning("%s is missing: peers' admission state (established keys, dedup memory) starts empty", path)
        return None
    except (OSError, ValueError) as err:
        log.warning("%s is unreadable (%s): peers' admission state starts empty", path, err)
        return None
    if not isinstance(state, dict):
        log.warning("%s holds no exchange state: peers' admission state starts empty", path)
        return None
    return state
