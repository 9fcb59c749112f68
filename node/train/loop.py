"""The round loop of one node, plain synchronous code (its steps: README "How a round works").

    tasks (+ hinted revisits) -> generate (plain, hinted, DARS extra) -> score -> share / collect
    -> compose (SAPO groups or cross-actor merge) -> update -> [held-out eval] -> metrics -> checkpoint

`share`/`collect` go through an `Exchange` (None when training alone; node/peers/self_replay.py for the
self-replay silo): the SAPO network layer plugs in there without reshaping the loop. The exchange
is built where the node is assembled (node/service/assembly.py) and passed in: the loop, on a floor
below peers/, never builds one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

from node.train.assembly import EXCHANGE_STATE, NodeParts, build_parts
from node.config.schema import NodeConfig
from node.train.eval import Evaluator
from node.train.groups import ScoredGroup, compose
from node.train.hint_writer import HintWriter
from node.train.hints import LEVELS, HintBook
from node.observe.metrics import MetricsLog, RoundTable
from node.train.rollouts import RolloutSampler
from node.observe.tensorboard import TensorBoardLog
from node.tasks import make_source
from node.tasks.base import Task
from policy.checkpoint import latest_checkpoint, load_weights, restore_rng, save_checkpoint
from policy.learner import Learner
from policy.losses import make_objective
from policy.models import phase_clock
from policy.types import SamplingParams

log = logging.getLogger(__name__)

@runtime_checkable
class Exchange(Protocol):
    """The seam for the SAPO network layer: never blocks the training loop. Everything the loop (and
    whoever runs a Node: node/service/join.py, node/testnet/) calls on it, optional capabilities
    included, so the loop never asks what its exchange can do. Implemented by node/peers/exchange.py
    SwarmExchange and node/peers/self_replay.py SelfReplay; where a capability does not apply the
    method does nothing (a silo has nobody to ask for hints and nothing a restart must keep).
    tests/integration/node/test_train_loop.py checks both against it."""

    last_round: dict  # what the latest collect adds to the round's metrics row ({} before the first)

    def share(self, round_index: int, groups: list[ScoredGroup]) -> None: ...

    def collect(self, round_index: int, local: list[ScoredGroup] = ()) -> list[ScoredGroup]: ...

    def request_hints(self, tasks: list[Task]) -> None: ...

    def take_hints(self) -> list: ...

    def take_hint_requests(self, k: int, answerable: Callable[[Task], bool]) -> list[tuple[Task, str]]: ...

    def publish_hints(self, task: Task, levels: dict[str, str]) -> None: ...

    def state_dict(self) -> dict | None:
        """What a restart must not forget, saved with each checkpoint (EXCHANGE_STATE); None: nothing."""

    def status(self) -> dict: ...

    def close(self) -> None: ...


class Node:
    """One node's round loop over the parts node/train/assembly.py built (`parts=None` builds them from
    cfg). Its exchange comes from where the node is assembled (node/service/assembly.py: build_exchange for
    a swarm, the silo's without a transport); None trains alone."""

    def __init__(self, cfg: NodeConfig, run_dir: Path, exchange: Exchange | None = None, *,
                 parts: NodeParts | None = None):
        if exchange is not None and not isinstance(exchange, Exchange):
            raise TypeError(f"{type(exchange).__name__} is not an Exchange (node/train/loop.py): it needs share, "
                            "collect, the hint methods, state_dict, status, close and last_round")
        if exchange is None and cfg.swarm.self_replay and cfg.swarm.external_per_round > 0:
            raise ValueError("swarm.self_replay: pass the silo's exchange (node/service/assembly.py: solo_node builds it)")
        parts = parts or build_parts(cfg)
        if parts.cfg is not cfg:
            raise ValueError("Node(cfg, parts=...): the parts were built from another config")
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.exchange = exchange
        self.parts = parts
        self.policy, self.model, self.objective = parts.policy, parts.model, parts.objective
        self.source, self.verifier, self.retokenizer = parts.source, parts.verifier, parts.retokenizer
        self.pass_rates, self.backend_line = parts.pass_rates, parts.backend_line
        self.learner = Learner(self.model, self.objective, cfg.optim, pad_id=self.policy.tokenizer.pad_token_id,
                               temperature=cfg.sampling.temperature,
                               external_objective=make_objective(cfg.loss.external, **cfg.loss.external_knobs),
                               off_policy=cfg.loss.off_policy, completion_budget=cfg.sampling.max_new_tokens,
                               max_external_tokens=cfg.max_external_tokens,
                               group_size=cfg.sampling.group_size + self.objective.extra_samples)
        self.hints = HintBook(cfg.hints, self.pass_rates, LEVELS if self.policy.chat else ("prefix",))
        n = cfg.sampling.group_size + self.objective.extra_samples  # mc needs G+1
        self.sampler = RolloutSampler(parts.sampling, n, cfg.allocation, self.pass_rates,
                                      self.objective.advantage == "mean_std")
        self.hint_writer = HintWriter(parts.sampling, cfg.hints)
        ood = (make_source(cfg.tasks.source, cfg.eval.ood, cfg.tasks.seed, heldout_split=cfg.tasks.heldout_split)
               if cfg.eval.ood else None)  # OOD is never trained: the split only makes its questions distinct
        self.evaluator = Evaluator(cfg.eval, parts.sampling, ood)
        self.metrics = MetricsLog(self.run_dir)
        self.clock = phase_clock(self.model)  # the phases' seconds: waits for a GPU's queued work first
        self.tensorboard = TensorBoardLog(self.run_dir) if cfg.run.tensorboard else None
        self.next_round = 0
        self.resumed_from: Path | None = None  # the checkpoint `resume` loaded
        self.checkpointed_round: int | None = None  # the newest round on disk

    @property
    def generator(self):
        return self.parts.sampling.generator

    @property
    def sampling(self) -> SamplingParams:
        return self.parts.sampling.params

    def close(self) -> None:
        """Stops what the node started outside this process (a vLLM inference server) and closes
        its TensorBoard event file."""
        if self.tensorboard is not None:
            self.tensorboard.close()
        close = getattr(self.generator, "close", None)
        if close is not None:
            close()

    def use_generator(self, generator) -> None:
        """Swap the rollout backend of the sampler, hint writer and evaluator (benchmarks force
        full-length sampling)."""
        self.parts.sampling.generator = generator

    @property
    def hinting(self) -> bool:
        return self.exchange is not None and self.cfg.hints.enabled and not self.cfg.swarm.self_replay  # nobody to ask

    # -- checkpoints -------------------------------------------------------------------------
    def resume(self, truncate_metrics: bool = True) -> int | None:
        """Load the newest checkpoint in run_dir, if any; returns its round. truncate_metrics=False
        leaves metrics.jsonl alone (`swarm-node eval` reads a run, it does not continue it)."""
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            if truncate_metrics:  # killed before its first checkpoint: every round runs again from 0
                self.metrics.truncate_after(-1)
                log.info("no checkpoint in %s: starting at round 0", self.run_dir,
                         extra={"event": "no_checkpoint", "next_round": 0, "run_dir": str(self.run_dir)})
            return None
        load_weights(self.model, ckpt)
        self.learner.optimizer.load_state_dict(ckpt.state["optimizer"])
        restore_rng(ckpt.state["rng"])
        extra = ckpt.state.get("extra", {})
        self.learner.policy_version = int(extra.get("policy_version", 0))
        self.pass_rates.load_state_dict(extra.get("pass_rates", {}))
        self.hints.load_state_dict(extra.get("hints", {}))
        self.generator.refresh(self.learner.policy_version)
        self.next_round = ckpt.round_index + 1
        self.resumed_from = ckpt.path
        self.checkpointed_round = ckpt.round_index
        if truncate_metrics:
            self.metrics.truncate_after(ckpt.round_index)
        log.log(logging.INFO if truncate_metrics else logging.DEBUG,  # `eval` reads a run, it does not resume it
                 "resumed from the checkpoint of round %d (%s); next round %d", ckpt.round_index, ckpt.path,
                 self.next_round, extra={"event": "resume", "round": ckpt.round_index, "next_round": self.next_round,
                                         "checkpoint": str(ckpt.path), "policy_version": self.learner.policy_version})
        return ckpt.round_index

    def checkpoint(self, round_index: int) -> Path:
        extra = {"policy_version": self.learner.policy_version, "pass_rates": self.pass_rates.state_dict(),
                 "hints": self.hints.state_dict()}
        exchange_state = self.exchange.state_dict() if self.exchange is not None else None
        files = {EXCHANGE_STATE: json.dumps(exchange_state)} if exchange_state is not None else {}
        started = time.perf_counter()
        path = save_checkpoint(self.run_dir, round_index, self.model, self.policy.tokenizer,
                               self.learner.optimizer, self.cfg.model_dump(mode="json"), extra=extra,
                               keep=self.cfg.run.keep_checkpoints, files=files)
        seconds = round(time.perf_counter() - started, 3)
        log.info("checkpoint of round %d written to %s", round_index, path,
                 extra={"event": "checkpoint", "round": round_index, "path": str(path),
                        "policy_version": self.learner.policy_version, "seconds": seconds})
        self.checkpointed_round = round_index
        return path

    # -- one round ---------------------------------------------------------------------------
    def _tasks(self, round_index: int) -> list[Task]:
        tasks = self.source.batch(round_index, self.cfg.tasks.prompts_per_round)
        if self.hinting:  # prompts we failed and now hold hints for come back until they anneal
            drawn = {t.prompt_key for t in tasks}
            tasks += [self.source.rebuild(ref) for ref in self.hints.revisits(round_index, drawn)]
        return tasks

    def run_round(self, round_index: int) -> dict:
        cpu0 = time.thread_time()  # this thread's CPU seconds: what a round cost whatever else the machine ran
        t0 = self.clock()
        tasks = self._tasks(round_index)
        hints = [self.hints.current(t) if self.hinting else None for t in tasks]
        local, sample_stats = self.sampler.sample(tasks, hints, self.learner.policy_version)
        for group in local:
            self.pass_rates.observe(group.task, group.unhinted())
            self.hints.observe(group)
            self.hint_writer.remember(group)
        t1 = self.clock()

        external: list[ScoredGroup] = []
        hint_stats: dict = {}
        if self.exchange is not None:
            self.exchange.share(round_index, local)
            if self.hinting:
                self.exchange.request_hints(self.hints.requests(local, round_index))
            external = self.exchange.collect(round_index, local)
            if self.hinting:
                hint_stats = self._exchange_hints()
        t2 = self.clock()

        groups, merged = compose(local, external, self.cfg.swarm.composition)
        stats = self.learner.update(groups)
        self.generator.refresh(self.learner.policy_version)  # next round samples from the updated weights
        t3 = self.clock()
        work = self.parts.sampling.take_work()  # generate calls, hint writing for peers
        row = self._row(round_index, tasks, local, external, merged, {**sample_stats, **hint_stats, **stats, **work},
                        (t0, t1, t2, t3))
        row["t_round_cpu"] = time.thread_time() - cpu0
        return {**row, **self.maybe_evaluate(round_index)}  # after the update; not in t_round

    # -- held-out evaluation -----------------------------------------------------------------
    def evaluate(self, tasks_per_family: int | None = None, k: int | None = None,
                 pass_at: list[int] | None = None) -> dict:
        """Greedy pass@1 and pass@k on the held-out set now (node/train/eval.py); touches no training
        state and no RNG."""
        return self.evaluator.evaluate(tasks_per_family, k, pass_at)

    def maybe_evaluate(self, round_index: int) -> dict:
        """The held-out metrics when round `round_index` is an evaluation round
        ((round_index + 1) % eval.every == 0), else {}."""
        return self.evaluate() if self.evaluator.due(round_index) else {}

    def _exchange_hints(self) -> dict:
        """Keep the hints we asked for; answer a few peers' requests for prompts we have solved
        (writing the abstract levels is a generate call on a chat model; solving is never one)."""
        started = time.perf_counter()
        accepted = sum(self.hints.add(h.task, h.level, h.text) for h in self.exchange.take_hints())
        served = 0
        for task, _sender in self.exchange.take_hint_requests(self.cfg.hints.serve_per_round,
                                                              self.hint_writer.can_answer):
            levels = self.hint_writer.hints_for(task)
            if levels:
                self.exchange.publish_hints(task, levels)
                served += 1
        return {"hints_accepted": float(accepted), "hint_requests_served": float(served),
                "t_exchange_hints": time.perf_counter() - started}

    def _row(self, round_index: int, tasks: list[Task], local: list[ScoredGroup], external: list[ScoredGroup],
             merged: int, stats: dict, times: tuple[float, float, float, float]) -> dict:
        """The metrics line of one round: own unhinted samples define reward and pass rate."""
        t0, t1, t2, t3 = times
        rewards = [r for g in local for r, h in zip(g.rewards, g.hinted or [False] * len(g.rewards)) if not h]
        correct = [c for g in local for c in g.unhinted()]
        n_rollouts = sum(len(g.rollouts) for g in local)
        n_tokens = sum(len(r.completion_ids) - r.hint_tokens for g in local for r in g.rollouts)
        per_dataset: dict[str, list[bool]] = {}
        for g in local:
            per_dataset.setdefault(g.task.ref.dataset, []).extend(g.unhinted())
        hinted = [g for g in local if g.hint is not None]
        return {
            "round": round_index,
            "policy_version": self.learner.policy_version,
            "reward_mean": sum(rewards) / max(1, len(rewards)),
            "pass_rate": sum(correct) / max(1, len(correct)),
            "pass_rate_by_dataset": {k: sum(v) / len(v) for k, v in per_dataset.items() if v},
            "correct_per_rollout": sum(c for g in local for c in g.correct) / max(1, n_rollouts),
            # successes this update could learn from: correct completions, own and peers' (verified), each
            # distinct (task, completion) once; hinted ones are not the policy's own successes
            "distinct_successes": len({(g.task.ref.key, tuple(r.completion_ids)) for g in (*local, *external)
                                       for r, c, h in zip(g.rollouts, g.correct, g.hinted or [False] * len(g.correct))
                                       if c and not h}),
            "groups_local": len(local),
            "groups_hinted": len(hinted),
            "hinted_pass_rate": (sum(c for g in hinted for c, h in zip(g.correct, g.hinted) if h)
                                 / max(1, sum(sum(g.hinted) for g in hinted))) if hinted else None,
            "groups_external": len(external),
            "groups_merged": merged,
            "groups_trained": len(local) + len(external) - merged - int(stats.get("groups_zero_adv", 0))
                              - int(stats.get("ext_groups_no_correct", 0)) - int(stats.get("own_groups_no_correct", 0)),
            "rollouts_generated": n_rollouts,
            "tokens_generated": n_tokens,
            "completion_len_mean": n_tokens / max(1, n_rollouts),
            "truncated_frac": sum(r.truncated for g in local for r in g.rollouts) / max(1, n_rollouts),
            "tokens_per_s": n_tokens / max(t3 - t0, 1e-9),
            "t_generate": t1 - t0 - stats.get("t_score", 0.0),
            "t_exchange": t2 - t1,
            "t_train": t3 - t2,
            "t_round": t3 - t0,
            "tasks_digest": hashlib.sha256("|".join(t.ref.key for t in tasks).encode()).hexdigest()[:16],
            **stats,
            **(self.exchange.last_round if self.exchange is not None else {}),
        }

    def run_one(self, rounds: int, annotate: Callable[[dict], dict] | None = None) -> dict:
        """The next round: train, log, and checkpoint when due (`rounds` is the run's total).
        `annotate` adds keys to the row before it is logged (the testnet's virtual time)."""
        round_index = self.next_round
        row = self.run_round(round_index)
        if annotate is not None:
            row = {**row, **annotate(row)}
        self.metrics.append(row)
        if self.tensorboard is not None:
            self.tensorboard.write(row)
        self.next_round = round_index + 1
        if (round_index + 1) % self.cfg.run.checkpoint_every == 0 or round_index + 1 == rounds:
            self.checkpoint(round_index)
        return row

    def run(self, rounds: int, table: RoundTable, stop: threading.Event | None = None) -> None:
        """Run until `rounds` rounds are complete in total (a resumed run continues the count), or
        until `stop` is set (node/service/shutdown.py): then the last finished round is checkpointed, so a
        stopped node loses nothing."""
        stop = stop or threading.Event()
        with table:
            while self.next_round < rounds and not stop.is_set():
                started = time.monotonic()
                table.add(self.run_one(rounds))
                if self.exchange is not None:  # pace rounds so peers' gossip can arrive in between
                    stop.wait(max(0.0, self.cfg.swarm.min_round_s - (time.monotonic() - started)))
        if stop.is_set() and self.next_round > 0 and self.checkpointed_round != self.next_round - 1:
            self.checkpoint(self.next_round - 1)
