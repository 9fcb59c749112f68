"""The round loop of one node (DESIGN.md "One round on one node"), plain synchronous code.

    tasks -> generate -> score -> share/collect -> mix -> update -> metrics -> checkpoint

`share`/`collect` go through an `Exchange` (None when training alone): the SAPO network layer
plugs in there without reshaping the loop.
"""
from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from node.config import NodeConfig
from node.metrics import MetricsLog, RoundTable
from node.tasks import make_source
from node.tasks.base import Task
from node.verifiers import SYSTEM_PROMPT
from policy.checkpoint import latest_checkpoint, load_weights, restore_rng, save_checkpoint
from policy.generation import make_generator
from policy.learner import Learner, apply_lora, autocast_context
from policy.losses import make_objective
from policy.models import LoadedPolicy, load_policy
from policy.types import Rollout, SamplingParams, TrainGroup, TrainSample


@dataclass
class ScoredGroup:
    """The G completions of one task with rewards recomputed by this node's verifier."""

    task: Task
    rollouts: list[Rollout]
    rewards: list[float]
    correct: list[bool]
    origin: str = "local"  # "local" or the sender's peer id
    meta: dict = field(default_factory=dict)


class Exchange(Protocol):
    """The seam for the SAPO network layer: never blocks the training loop."""

    def share(self, round_index: int, groups: list[ScoredGroup]) -> None: ...

    def collect(self, round_index: int) -> list[ScoredGroup]: ...


def render_prompt(policy: LoadedPolicy, question: str) -> list[int]:
    """Prompt token ids: the chat template with our answer-format instructions for chat models,
    bos + raw text for the tiny from-scratch model."""
    tok = policy.tokenizer
    if policy.chat:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]
    return [tok.bos_token_id] + tok(question, add_special_tokens=False)["input_ids"]


def to_train_group(group: ScoredGroup) -> TrainGroup:
    samples = [TrainSample(prompt_ids=r.prompt_ids, completion_ids=r.completion_ids,
                           behavior_logprobs=r.logprobs, reward=reward)
               for r, reward in zip(group.rollouts, group.rewards)]
    return TrainGroup(samples=samples, external=group.origin != "local", meta={"task": group.task.ref.key})


def retokenizer(policy: LoadedPolicy):
    """(question, text, truncated) -> (prompt ids, completion ids) in this node's tokenizer."""
    tok = policy.tokenizer

    def retokenize(question: str, text: str, truncated: bool) -> tuple[list[int], list[int]]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        return render_prompt(policy, question), ids if truncated else ids + [tok.eos_token_id]

    return retokenize


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Node:
    def __init__(self, cfg: NodeConfig, run_dir: Path, exchange: Exchange | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.exchange = exchange
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        seed_everything(cfg.run.seed)
        self.policy = load_policy(cfg.model)
        self.model = apply_lora(self.policy.model, cfg.optim)
        knobs = dict(cfg.loss.knobs)
        if cfg.loss.name == "dr_grpo":  # CN aggregation normalizes by the max completion length
            knobs.setdefault("l_norm", cfg.sampling.max_new_tokens)
        self.objective = make_objective(cfg.loss.name, **knobs)
        self.source = make_source(cfg.tasks.source, cfg.tasks.datasets, cfg.tasks.seed)
        self.verifier = cfg.verifier
        self.generator = make_generator(cfg.sampling.backend, self.policy)
        self.learner = Learner(self.model, self.objective, cfg.optim, pad_id=self.policy.tokenizer.pad_token_id,
                               temperature=cfg.sampling.temperature)
        self.sampling = SamplingParams(temperature=cfg.sampling.temperature,
                                       max_new_tokens=cfg.sampling.max_new_tokens)
        self.metrics = MetricsLog(self.run_dir)
        self.next_round = 0

    # -- checkpoints -------------------------------------------------------------------------
    def resume(self) -> int | None:
        """Load the newest checkpoint in run_dir, if any; returns its round."""
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            return None
        load_weights(self.model, ckpt)
        self.learner.optimizer.load_state_dict(ckpt.state["optimizer"])
        restore_rng(ckpt.state["rng"])
        self.generator.refresh()
        self.next_round = ckpt.round_index + 1
        self.metrics.truncate_after(ckpt.round_index)
        return ckpt.round_index

    def checkpoint(self, round_index: int) -> Path:
        return save_checkpoint(self.run_dir, round_index, self.model, self.policy.tokenizer,
                               self.learner.optimizer, self.cfg.model_dump(mode="json"),
                               keep=self.cfg.run.keep_checkpoints)

    # -- one round ---------------------------------------------------------------------------
    def run_round(self, round_index: int) -> dict:
        t0 = time.perf_counter()
        tasks = self.source.batch(round_index, self.cfg.tasks.prompts_per_round)
        prompts = [render_prompt(self.policy, t.question) for t in tasks]
        n = self.cfg.sampling.group_size + self.objective.extra_samples  # mc needs G+1
        with autocast_context(self.cfg.optim.autocast_bf16, self.learner.device):
            completions = self.generator.generate(prompts, n, self.sampling)  # [prompts][n]
        t1 = time.perf_counter()

        local = []
        for task, rollouts in zip(tasks, completions):
            scored = [self.verifier.score(task, self.source, r.text) for r in rollouts]
            local.append(ScoredGroup(task=task, rollouts=rollouts, rewards=[s[0] for s in scored],
                                     correct=[bool(s[1]["correct"]) for s in scored]))
        t2 = time.perf_counter()

        external: list[ScoredGroup] = []
        if self.exchange is not None:
            self.exchange.share(round_index, local)
            external = self.exchange.collect(round_index)
        groups = [to_train_group(g) for g in local + external]
        stats = self.learner.update(groups)
        self.generator.refresh()  # the generator must sample from the updated weights next round
        t3 = time.perf_counter()

        rewards = [r for g in local for r in g.rewards]
        correct = [c for g in local for c in g.correct]
        n_tokens = sum(len(r.completion_ids) for rs in completions for r in rs)
        per_dataset: dict[str, list[bool]] = {}
        for g in local:
            per_dataset.setdefault(g.task.ref.dataset, []).extend(g.correct)
        return {
            "round": round_index,
            "reward_mean": sum(rewards) / len(rewards),
            "pass_rate": sum(correct) / len(correct),
            "pass_rate_by_dataset": {k: sum(v) / len(v) for k, v in per_dataset.items()},
            "groups_local": len(local),
            "groups_external": len(external),
            "groups_trained": len(groups) - int(stats.get("groups_zero_adv", 0)),
            "tokens_generated": n_tokens,
            "completion_len_mean": n_tokens / max(1, len(rewards)),
            "truncated_frac": sum(r.truncated for rs in completions for r in rs) / max(1, len(rewards)),
            "tokens_per_s": n_tokens / max(t3 - t0, 1e-9),
            "t_generate": t1 - t0,
            "t_score": t2 - t1,
            "t_train": t3 - t2,
            "t_round": t3 - t0,
            "tasks_digest": hashlib.sha256("|".join(t.ref.key for t in tasks).encode()).hexdigest()[:16],
            **stats,
            **(getattr(self.exchange, "last_round", None) or {}),
        }

    def run(self, rounds: int, table: RoundTable) -> None:
        """Run until `rounds` rounds are complete in total (a resumed run continues the count)."""
        with table:
            for round_index in range(self.next_round, rounds):
                started = time.monotonic()
                row = self.run_round(round_index)
                self.metrics.append(row)
                table.add(row)
                self.next_round = round_index + 1
                if (round_index + 1) % self.cfg.run.checkpoint_every == 0 or round_index + 1 == rounds:
                    self.checkpoint(round_index)
                if self.exchange is not None:  # pace rounds so peers' gossip can arrive in between
                    time.sleep(max(0.0, self.cfg.swarm.min_round_s - (time.monotonic() - started)))
