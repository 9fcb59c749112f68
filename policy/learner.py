"""The update step: groups of scored completions in, optimizer steps out.

One call of `Learner.update` is one round's training:
  1. advantages per group, one kind for every group, ours or a peer's (the local objective's:
     mean/std, mean only, median + pivot); peers' failures are damped per behavior tier inside a
     weighted baseline, so a group still sums to zero; a peer group larger than ours counts as G
     rows (`group_size_weight`); with peer_failures = "drop" only a peer's correct samples at
     A >= 0 train, the other peer rows are dropped (policy/selection.py); so is every row at A = 0
     exactly whose objective is `zero_advantage_inert` (its term and gradient are then 0);
  2. pad the trained rows into one [B, P+C] batch (prompts left-padded, completions right-padded);
     a dropped row is never forwarded, yet counts in every minibatch denominator it falls in
     (`LossInputs.absent_rows` / `absent_tokens`), so the gradient is the one of training it at
     advantage 0;
  3. l^old: this node's log-probs at the start of the update (skipped when there is exactly one
     minibatch step, where l^old == sg[l] exactly, as TRL does); it is also l^prox, from which
     tier-1 and tier-2 behavior log-probs of peers' samples are derived;
  4. `epochs` passes over `minibatches` shuffled minibatches, one optimizer step each, so ratios
     really leave 1 after the first step. This node's samples get the local objective, peers'
     samples the external one (per tier, for the statistics); one aggregation over both.
     A minibatch above `backward_chunk_tokens` trains in row chunks, each backpropagating its
     share of the loss at once (every aggregation is linear in the per-token term): one forward
     per row, the activations of one chunk alive at a time. With `shared_prefix`, the rows of a
     prompt group run their prompt once (policy/shared_prefix.py) and chunks keep a group's rows
     together.

A peer's claimed log-probs are bounded before any objective sees them: b >= l^old token by token
(`bound_claims`), so no claim can weigh a peer's token more than the ratio-1 treatment of the same
text (tier 2, SAPO's) does; policy/ALGORITHMS.md, "What a peer's claims can buy".

Peers' samples cannot blow up the batch: before padding, a peer's sample longer than
`max_external_tokens` (+ eos), with a prompt much longer than ours, or with a token id outside our
vocabulary is refused (its group, or its samples in a merged group, counted as
`external_groups_refused`); an exception while training on peers' samples drops them and trains
the round on this node's own samples (`external_update_failed`), never ends the round; if some
optimizer steps were already taken, the update stops there (our samples are not trained twice).

Dropout is off in every forward pass of the update: l^old, the loss and the chunked backward must
be one deterministic function, else on-policy ratios are not 1 and chunks disagree.

The host waits on the device once per optimizer step: the step's statistics stay 0-dim tensors
until `_step` reads them all in one transfer (on a GPU every float(t) is a sync); which tiers the
batch holds, its token count and row counts are known on the host from the batch's CPU build.
That read comes before the optimizer step, so a step whose gradient norm is NaN or infinite is
skipped (its gradient dropped, the weights and `policy_version` unchanged, `skipped_step_frac` in
the round's statistics) instead of turning every weight into NaN.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import math

import torch

from policy.behavior import apply_alignment, bound_claims
from policy.logprobs import completion_logprobs, pad_batch
from policy.loss_terms import Stats, sampler_mismatch, stats_to_floats
from policy.losses import LossInputs, Objective, apply_row_keep
from policy.precision import autocast_context
from policy.selection import Selection, absent_weights, select_rows, skip_zero_rows
from policy.settings import OffPolicyConfig, OptimConfig
from policy.shared_prefix import in_row_order, prompt_groups, row_chunks, shared_prefix_logprobs
from policy.types import TIER_ALIGNED, TIER_EXACT, TIER_PROXY, TIERS, TrainGroup, TrainSample

LOCAL = -1  # tier code of this node's own samples in the per-row tier tensor
# A peer's prompt may be this much longer than our longest (padding is to the longest row, and the
# attention mask grows with its square); rebuilt tasks of the same families are about as long as ours.
EXTERNAL_PROMPT_SLACK = 2.0
MIN_PROMPT_CAP = 256
# a step statistic that is NaN when the step (or a row chunk) had none: no claimed token to bound
CLAIMS_BOUNDED = "ext_claims_bounded_frac"
CLAIMING = tuple(f"ext_t{t}_" for t in (TIER_EXACT, TIER_ALIGNED))  # statistics of the rows that may claim

log = logging.getLogger(__name__)


def apply_lora(model: torch.nn.Module, cfg: OptimConfig) -> torch.nn.Module:
    """Wrap `model` with LoRA adapters when cfg.lora_rank > 0 (only adapters then train)."""
    if cfg.lora_rank == 0:
        return model
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=cfg.lora_targets,
                      lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


class Learner:
    def __init__(self, model: torch.nn.Module, objective: Objective, cfg: OptimConfig, pad_id: int,
                 temperature: float, *, external_objective: Objective | None = None,
                 off_policy: OffPolicyConfig = OffPolicyConfig(), completion_budget: int | None = None,
                 max_external_tokens: int | None = None, group_size: int | None = None):
        self.model = model
        self.objective = objective
        self.external_objective = external_objective or objective
        self.off_policy = off_policy
        self.cfg = cfg
        self.pad_id = pad_id
        self.temperature = temperature  # log-probs on logits / T, else the on-policy ratio is not 1
        self.completion_budget = completion_budget  # max new tokens: Dr. GRPO's L_norm
        # a peer's completion longer than this (plus its eos) is refused before padding
        self.max_external_tokens = max_external_tokens or completion_budget
        # our group size (G, plus mc's pivot): a peer group of more completions counts as this many
        # rows; None = the largest group of our own in each update
        self.group_size = group_size
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.params = [p for p in model.parameters() if p.requires_grad]  # LoRA: adapters only
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.device = next(model.parameters()).device
        self.policy_version = 0  # optimizer steps taken so far (saved in checkpoints)

    def _logprobs(self, input_ids, attention_mask, n_completion, groups: torch.Tensor | None = None):
        """Log-probs [b, C] of the rows input_ids / attention_mask [b, P+C]; with their prompt group
        codes `groups` [b] (host; shared_prefix on), each group's prompt is computed once."""
        with autocast_context(self.cfg.autocast_bf16, self.device):
            if groups is not None:
                return shared_prefix_logprobs(self.model, input_ids, attention_mask, n_completion,
                                              self.temperature, groups).float()
            return completion_logprobs(self.model, input_ids, attention_mask, n_completion,
                                       self.temperature).float()

    @staticmethod
    def _resolve_behavior(samples: list[TrainSample], behavior: torch.Tensor, tier: torch.Tensor,
                          prox: torch.Tensor) -> None:
        """Fill tier-1 rows of behavior [B, C] from the receiver's proxy log-probs prox [B, C] (in
        place). A tier-1 row without an alignment plan has no usable claim: tier 2 in `tier` [B].
        Rows left NaN (tier 2, unknown) take l^old in the loss."""
        for row, sample in enumerate(samples):
            if int(tier[row]) != TIER_ALIGNED:
                continue
            if sample.alignment is None:
                tier[row] = TIER_PROXY
                continue
            n = len(sample.completion_ids)
            behavior[row, :n] = apply_alignment(sample.alignment, prox[row, :n])  # [n]

    def _loss(self, x: LossInputs, tier: torch.Tensor,
              present: dict[int, int] | None = None) -> tuple[torch.Tensor, Stats]:
        """One aggregation (the local objective's) of every row's per-token term over the whole
        minibatch x, rows tiered by `tier` [b] (`present`: see _terms); the statistics (on the device)."""
        term, mask, stats = self._terms(x, tier, present)  # [b, C], [b, C]
        return self.objective.aggregate(term, dataclasses.replace(x, mask=mask)), stats

    def observe_loss(self, x: LossInputs, tier: torch.Tensor, loss: torch.Tensor) -> None:
        """The extension point for experiments (scripts/experiments/peer_influence.py overrides it): each
        backward's inputs, rows' tiers [b] and loss, still a graph over x.logp (by chunks: a chunk's share,
        whose gradient is the update's for its rows), before the backward. Training does nothing here."""

    def _terms(self, x: LossInputs, tier: torch.Tensor,
               present: dict[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor, Stats]:
        """Per-token terms [b, C]: this node's rows through the local objective, each tier's peer rows
        through the external one; the mask [b, C] after row filters; statistics (0-dim tensors). Our
        rows also report the sampler's mismatch to the learner (sampler_logp_diff, sampler_kl).
        `present`: the rows per tier code of the batch in training, known on the host (None: unknown).
        A tier it has no row of costs no search for its rows, a batch of one kind of row none at all:
        a search is a device sync."""
        term = torch.zeros_like(x.logp)  # [b, C]
        mask = x.mask.clone()  # [b, C]
        stats: Stats = {}
        present = present or {code: 1 for code in (LOCAL, *TIERS)}  # unknown: search every tier
        parts = [(self.objective, LOCAL, "")]
        parts += [(self.external_objective, t, f"ext_t{t}_") for t in TIERS]
        for objective, code, prefix in parts:
            if code not in present:
                continue
            if len(present) == 1:  # every row is of this kind
                rows = torch.arange(tier.shape[0], device=tier.device)  # [b']
            else:
                rows = (tier == code).nonzero().squeeze(-1)  # [b']
            if rows.numel() == 0:
                continue
            part = _rows(x, rows)
            sub, filtered = apply_row_keep(objective, part)  # F-TIS: drops far off-policy negatives
            part_term, part_stats = objective.token_loss(sub)  # [b', C]
            if code == LOCAL:  # our sampler against our learner (a sampling copy, vLLM: not 0)
                part_stats.update(sampler_mismatch(part.old_logp, part.behavior_logp, part.mask))
            term[rows] = part_term
            mask[rows] = sub.mask
            if sub is not part:  # the objective filters rows
                part_stats["filtered_frac"] = filtered
            stats.update({prefix + k: v for k, v in part_stats.items()})
        return term, mask, stats

    def _fits(self, sample: TrainSample, prompt_cap: int) -> bool:
        """Can a peer's sample join the batch without growing it beyond what our own could be?"""
        ids = sample.completion_ids
        if self.max_external_tokens is not None and len(ids) > self.max_external_tokens + 1:  # + eos
            return False
        if len(sample.prompt_ids) > prompt_cap:
            return False
        return all(0 <= t < self.vocab_size for t in (*sample.prompt_ids, *ids))

    def admit_external(self, groups: list[TrainGroup]) -> tuple[list[TrainGroup], int]:
        """`groups` without peers' samples that do not fit (see the module doc); a peer's group with
        one such sample goes whole, a merged group keeps its own samples. Returns (groups, refused)."""
        local_prompts = [len(s.prompt_ids) for g in groups for s in g.samples if s.tier is None]
        prompt_cap = max(MIN_PROMPT_CAP, int(EXTERNAL_PROMPT_SLACK * max(local_prompts, default=0)))
        kept, refused = [], 0
        for group in groups:
            bad = [s for s in group.samples if s.tier is not None and not self._fits(s, prompt_cap)]
            if not bad:
                kept.append(group)
                continue
            refused += 1
            own = [s for s in group.samples if s.tier is None]
            if own:
                kept.append(dataclasses.replace(group, samples=own))
        return kept, refused

    def _backward_chunks(self, shape: torch.Size) -> int:
        """How many row chunks a [b, P+C] minibatch backpropagates in (1 = all at once)."""
        limit = self.cfg.backward_chunk_tokens
        rows, width = shape
        if limit == 0 or rows * width <= limit:
            return 1
        return min(rows, math.ceil(rows * width / limit))

    def _chunked_logprobs(self, ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int,
                          groups: torch.Tensor | None) -> torch.Tensor:
        """Log-probs [B, C] without grad, in the row chunks the backward uses: the logits of every
        row at once (SmolLM2, 64 rows x 65 completion columns x 49,152: 0.8 GB in float32) never exist."""
        pieces = row_chunks(ids.shape[0], self._backward_chunks(ids.shape), groups)  # host [b'] each
        parts = [self._logprobs(ids[r.to(ids.device)], attention_mask[r.to(ids.device)], n_completion,
                                _subset(groups, r)) for r in pieces]  # [b', C] each
        return in_row_order(parts, pieces)  # [B, C]

    def _backward_through_model(self, ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int,
                                grad_logp: torch.Tensor, chunks: int, groups: torch.Tensor | None) -> None:
        """Chain rule in two halves: the loss gave dL/dlogp [b, C] for every row; each row chunk now
        recomputes its log-probs with grad and backpropagates that slice into the parameters, which
        accumulate the full gradient. Activations of one chunk are alive at a time (SmolLM2, 64 rows
        x 130 tokens: all at once they were most of a 15.7 GB round)."""
        for piece in row_chunks(ids.shape[0], chunks, groups):
            rows = piece.to(ids.device)  # [b']
            logp = self._logprobs(ids[rows], attention_mask[rows], n_completion, _subset(groups, piece))  # [b', C]
            logp.backward(grad_logp[rows])  # [b', C]

    def update(self, groups: list[TrainGroup]) -> dict[str, float]:
        """Train on `groups`; returns loss/ratio statistics averaged over the optimizer steps."""
        groups, refused = self.admit_external(groups)
        refused_stats = {"external_groups_refused": float(refused)} if refused else {}
        if not any(s.tier is not None for g in groups for s in g.samples):
            return {**self._update(groups), **refused_stats}
        version_before = self.policy_version
        try:
            return {**self._update(groups), **refused_stats}
        except (RuntimeError, ValueError, IndexError) as err:  # includes torch's allocation failures
            self.optimizer.zero_grad(set_to_none=True)
            steps = self.policy_version - version_before
            if steps:  # our samples were already in those steps: training them again would count them twice
                log.warning("training on peers' samples failed after %d optimizer step(s) (%r); the update "
                            "stops there", steps, err)
                return {**refused_stats, "external_update_failed": 1.0, "optimizer_steps": float(steps)}
            log.warning("training on peers' samples failed (%r); this round trains on our own samples only", err)
            own = [dataclasses.replace(g, samples=[s for s in g.samples if s.tier is None]) for g in groups]
            stats = self._update([g for g in own if g.samples])
            return {**stats, **refused_stats, "external_update_failed": 1.0}

    def _select(self, groups: list[TrainGroup]) -> Selection:
        """The update's rows: advantages, row weights, dropped rows (policy/selection.py): peers'
        failures, and rows at A = 0 that their objective (ours or the external one) makes free."""
        sel = select_rows(groups, self.objective.advantage, self.off_policy, self.group_size,
                          self.cfg.skip_zero_advantage)
        return skip_zero_rows(sel, own=self.objective.zero_advantage_inert,
                              peer=self.external_objective.zero_advantage_inert)

    def _update(self, groups: list[TrainGroup]) -> dict[str, float]:
        sel = self._select(groups)
        trained = sel.trained  # rows forwarded
        stats = {"groups_zero_adv": float(sel.groups_zero_adv), "samples_trained": float(len(trained)),
                 **sel.drop_stats()}
        if not trained:
            return stats
        self.model.eval()  # dropout off: see the module doc
        batch = self._batch([sel.samples[i] for i in trained], [sel.advantages[i] for i in trained],
                            [sel.row_weights[i] for i in trained])
        for t in TIERS:
            if (n_tier := batch.tier_rows.get(t, 0)) > 0:
                stats[f"ext_t{t}_samples"] = float(n_tier)
        version_before = self.policy_version
        stats.update(self._train(batch, sel, trained))
        stats["optimizer_steps"] = float(self.policy_version - version_before)  # less any step skipped
        stats["tokens_trained"], stats["tokens_forwarded"] = batch.tokens, float(batch.input_ids.numel())  # padded
        return stats

    def _train(self, batch: _Batch, sel: Selection, trained: list[int]) -> dict[str, float]:
        """`epochs` passes of `minibatches` optimizer steps; the statistics averaged over the steps that
        had them. Minibatches are drawn over every row, dropped ones too, so each has the rows and the
        denominators it had with the dropped rows trained at advantage 0; only its trained rows are
        forwarded (`trained`: their indices in sel, in batch order)."""
        absent_rows, absent_tokens = absent_weights(sel)  # [N], [N]
        batch_row = torch.full((len(sel.samples),), -1, dtype=torch.long)  # [N] row in the batch, -1 = dropped
        batch_row[trained] = torch.arange(len(trained))  # [N]
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for _ in range(self.cfg.epochs):
            order = torch.randperm(len(sel.samples))  # [N]
            for rows in order.chunk(self.cfg.minibatches):
                idx = batch_row[rows]  # [n]
                absent = {"absent_rows": float(absent_rows[rows].sum()),
                          "absent_tokens": float(absent_tokens[rows].sum())}
                for key, value in self._step(batch, idx[idx >= 0], absent).items():
                    if isinstance(value, (int, float)) and math.isfinite(value):
                        sums[key] = sums.get(key, 0.0) + value
                        counts[key] = counts.get(key, 0) + 1
        return {key: sums[key] / counts[key] for key in sums}

    def _batch(self, samples: list[TrainSample], advantages: list[float], row_weights: list[float]) -> _Batch:
        """The samples padded into one batch on the model's device, with l^old when the update needs
        it and the tier-1 behavior log-probs derived from it."""
        input_ids, attention_mask, completion_mask = pad_batch(
            [s.prompt_ids for s in samples], [s.completion_ids for s in samples], self.pad_id)
        # input_ids/attention_mask: [B, P+C]; completion_mask: [B, C]
        n_completion = completion_mask.shape[1]
        loss_mask = completion_mask.clone().float()  # [B, C]
        behavior = torch.full(loss_mask.shape, float("nan"))  # [B, C]; NaN = unknown (use l^old)
        use_sender = self.off_policy.sender_logprobs
        tier = torch.tensor([LOCAL if s.tier is None else s.tier if use_sender else TIER_PROXY
                             for s in samples])  # [B]
        for i, s in enumerate(samples):
            n = len(s.completion_ids)
            if s.loss_mask is not None:
                loss_mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)  # hint tokens -> 0
            if s.behavior_logprobs is not None and (s.tier is None or use_sender):
                behavior[i, :n] = torch.tensor(s.behavior_logprobs, dtype=torch.float32)
        adv_t = torch.tensor(advantages, dtype=torch.float32)  # [B]
        row_weight = torch.tensor(row_weights, dtype=torch.float32)  # [B]
        needs_prox = bool((tier == TIER_ALIGNED).any())
        groups = prompt_groups([s.prompt_ids for s in samples]) if self.cfg.shared_prefix else None  # [B] host
        # the batch is built on the CPU; everything the loss touches moves to the model's device
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)  # [B, P+C]

        n_steps = self.cfg.epochs * self.cfg.minibatches
        old_logp = None
        if n_steps > 1 or needs_prox:  # l^old must be frozen at the start of the update
            with torch.no_grad():
                old_logp = self._chunked_logprobs(input_ids, attention_mask, n_completion, groups)  # [B, C]
            if needs_prox:  # only tier-1 rows read it: no device -> host copy otherwise
                self._resolve_behavior(samples, behavior, tier, old_logp.cpu())
        tier_rows = dict(collections.Counter(tier.tolist()))  # read while still on the CPU: no device sync
        tokens = float(loss_mask.sum())  # [] on the CPU
        loss_mask, behavior, adv_t, tier, row_weight = (
            t.to(self.device) for t in (loss_mask, behavior, adv_t, tier, row_weight))
        return _Batch(input_ids, attention_mask, n_completion, loss_mask, behavior, tier, adv_t, row_weight,
                      old_logp, tier_rows, tokens, groups)

    def _step(self, batch: _Batch, idx: torch.Tensor, absent: dict[str, float]) -> dict[str, float]:
        """One optimizer step on the batch rows `idx` [b] (host), with `absent` (LossInputs' absent_rows
        and absent_tokens) for the minibatch's dropped rows; the step's statistics, read on the host in
        one transfer, the step's only device sync (NaN: a statistic this step did not have)."""
        groups = _subset(batch.prompt_group, idx)  # [b] host, None: shared_prefix off
        idx = idx.to(self.device)  # [b]
        chunks = self._backward_chunks(batch.input_ids[idx].shape)
        self.optimizer.zero_grad(set_to_none=True)
        if idx.numel() == 0:  # only dropped rows: the zero gradient they gave at advantage 0 (AdamW still steps)
            for p in self.params:
                p.grad = torch.zeros_like(p)
            loss, step_stats = 0.0, {}
        elif chunks > 1 and not (self.objective.filters_rows or self.external_objective.filters_rows):
            loss, step_stats = self._backward_by_chunk(batch, idx, chunks, absent, groups)
        else:
            loss, step_stats = self._backward_whole(batch, idx, chunks, absent, groups)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)  # [], on the device
        stats = stats_to_floats({**step_stats, "loss": loss, "grad_norm": grad_norm})  # the step's one sync
        if not math.isfinite(stats["grad_norm"]):
            # A NaN or inf gradient would make every weight NaN for good (one of 24 SmolLM2 nodes on an
            # H200 did so): skip the step, as AMP's GradScaler does, and say so in the round's row.
            log.warning("skipped an optimizer step: gradient norm %s (loss %s)", stats["grad_norm"], stats["loss"])
            self.optimizer.zero_grad(set_to_none=True)
            return {**stats, "skipped_step_frac": 1.0}
        self.optimizer.step()
        self.policy_version += 1
        return {**stats, "skipped_step_frac": 0.0}

    def _inputs(self, batch: _Batch, idx: torch.Tensor, logp: torch.Tensor,
                absent: dict[str, float]) -> tuple[LossInputs, torch.Tensor]:
        """The loss inputs of the batch rows `idx` [b] with their log-probs logp [b, C] and the
        minibatch's dropped rows (`absent`); the fraction of peers' claimed tokens bounded ([],
        NaN: none claimed)."""
        old = batch.old_logp[idx] if batch.old_logp is not None else logp.detach()  # [b, C]
        beh, old, bounded_frac = resolve_claims(batch.behavior[idx], old, batch.tier[idx], batch.loss_mask[idx],
                                                self.off_policy.proximal)  # [b, C], [b, C]
        x = LossInputs(logp=logp, old_logp=old, behavior_logp=beh, mask=batch.loss_mask[idx],
                       advantages=batch.advantages[idx], completion_budget=self.completion_budget,
                       row_weight=batch.row_weight[idx], **absent)
        return x, bounded_frac

    def _backward_whole(self, batch: _Batch, idx: torch.Tensor, chunks: int, absent: dict[str, float],
                        groups: torch.Tensor | None = None) -> tuple[torch.Tensor, Stats]:
        """The loss over all rows `idx` [b] at once, then the model's backward in `chunks` row chunks
        (more than 1: every row's log-probs first without grad, then again with grad per chunk: an
        extra forward, the price of a row filter that reads the whole batch); `groups` [b] (host):
        the rows' prompt groups when shared_prefix is on. Returns (loss, stats), on the device."""
        ids, am, n_completion = batch.input_ids[idx], batch.attention_mask[idx], batch.n_completion  # [b, P+C]
        if chunks == 1:
            logp = self._logprobs(ids, am, n_completion, groups)  # [b, C]
        else:
            with torch.no_grad():
                logp = self._chunked_logprobs(ids, am, n_completion, groups).requires_grad_()  # [b, C], a leaf
        x, bounded_frac = self._inputs(batch, idx, logp, absent)
        loss, stats = self._loss(x, batch.tier[idx], batch.tier_rows)
        self.observe_loss(x, batch.tier[idx], loss)
        stats[CLAIMS_BOUNDED] = bounded_frac  # [] NaN: none claimed (the step's statistics skip it)
        loss.backward()
        if chunks > 1:
            self._backward_through_model(ids, am, n_completion, logp.grad, chunks, groups)
        return loss.detach(), stats

    def _backward_by_chunk(self, batch: _Batch, idx: torch.Tensor, chunks: int, absent: dict[str, float],
                           groups: torch.Tensor | None = None) -> tuple[torch.Tensor, Stats]:
        """The loss and the model's backward chunk by chunk, one forward per row: every aggregation is
        linear in the per-token term, with weights dL/dterm that depend only on the masks, row weights
        and budget, so each chunk's share of the loss is known before any log-prob is. The sum of the
        shares is the loss over all rows, and so are the accumulated gradients (to float rounding).
        Statistics are averaged over the chunks, weighted by their trainable tokens (NaN where no
        chunk had tokens). All on the device, in float64: the sums a Python float would hold."""
        weights = self._aggregation_weights(batch, idx, absent)  # [b, C]
        loss, sums, norms = 0.0, {}, {}
        for piece in row_chunks(idx.shape[0], chunks, groups):  # a prompt group's rows together (shared_prefix)
            rows = piece.to(idx.device)  # [b']
            sub = idx[rows]  # [b']
            logp = self._logprobs(batch.input_ids[sub], batch.attention_mask[sub], batch.n_completion,
                                  _subset(groups, piece))  # [b', C]
            x, bounded_frac = self._inputs(batch, sub, logp, absent)
            term, mask, stats = self._terms(x, batch.tier[sub], batch.tier_rows)  # [b', C], [b', C]
            share = (weights[rows] * torch.where(mask > 0, term, torch.zeros_like(term))).sum()  # []
            self.observe_loss(x, batch.tier[sub], share)
            share.backward()
            loss = loss + share.detach().double()  # []
            tokens = mask.sum().double()  # []
            if any(key.startswith(CLAIMING) for key in stats):  # rows that may claim: the fraction's place
                stats[CLAIMS_BOUNDED] = bounded_frac
            for key, value in stats.items():
                weight = tokens  # []
                if key == CLAIMS_BOUNDED:  # NaN: no claimed token in this chunk, which then adds nothing
                    weight, value = torch.where(value.isnan(), 0.0, tokens), value.nan_to_num(0.0)  # [], []
                value = value.double() if isinstance(value, torch.Tensor) else value  # []
                sums[key] = sums.get(key, 0.0) + value * weight  # []
                norms[key] = norms.get(key, 0.0) + weight  # []
        return loss, {key: torch.where(norms[key] > 0, sums[key] / norms[key], math.nan) for key in sums}

    def _aggregation_weights(self, batch: _Batch, idx: torch.Tensor, absent: dict[str, float]) -> torch.Tensor:
        """dL/dterm [b, C] of the local objective's aggregation over the rows `idx` [b] and the
        minibatch's dropped rows (`absent`: in the denominators only); 0 off the mask."""
        mask = batch.loss_mask[idx]  # [b, C]
        probe = torch.zeros_like(mask, requires_grad=True)  # [b, C] stands for the per-token term
        x = LossInputs(logp=probe.detach(), old_logp=probe.detach(), behavior_logp=probe.detach(), mask=mask,
                       advantages=batch.advantages[idx], completion_budget=self.completion_budget,
                       row_weight=batch.row_weight[idx], **absent)
        self.objective.aggregate(probe, x).backward()
        return probe.grad  # [b, C]


@dataclasses.dataclass
class _Batch:
    """One update's padded batch on the model's device: B rows of P prompt + C completion tokens."""

    input_ids: torch.Tensor  # [B, P+C]
    attention_mask: torch.Tensor  # [B, P+C]
    n_completion: int  # C
    loss_mask: torch.Tensor  # [B, C] 1 on trainable completion tokens
    behavior: torch.Tensor  # [B, C] behavior log-probs, NaN = unknown (l^old is used)
    tier: torch.Tensor  # [B] LOCAL or a peer's behavior tier
    advantages: torch.Tensor  # [B]
    row_weight: torch.Tensor  # [B]
    old_logp: torch.Tensor | None  # [B, C] l^old; None with one optimizer step (then l^old = sg[l])
    tier_rows: dict[int, int]  # rows per tier code (LOCAL or a peer tier), on the host
    tokens: float  # trainable tokens of the batch (loss_mask's sum), on the host
    prompt_group: torch.Tensor | None = None  # [B] each row's prompt group code, on the host; None: shared_prefix off


def resolve_claims(behavior: torch.Tensor, old: torch.Tensor, tier: torch.Tensor, mask: torch.Tensor,
                   proximal: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(b, l^old, fraction of claimed tokens bounded: [] float64 on the device, NaN when no token was
    claimed) for a minibatch, as every objective sees them.

    behavior [b, C] (NaN where unknown: tier 2, or our own rows without log-probs), old [b, C] our
    l^old, tier [b] (LOCAL or a peer tier), mask [b, C]. Unknown b becomes l^old; a peer's claimed
    b (tiers 0, 1) is bounded below by l^old (`bound_claims`); with proximal = "behavior" a peer
    row's l^old is that bounded b, so PPO's ratio to the sampler is never above ours either."""
    beh = torch.where(torch.isnan(behavior), old, behavior)  # [b, C]
    claimed = ((tier == TIER_EXACT) | (tier == TIER_ALIGNED))[:, None] & (mask > 0)  # [b, C]
    beh, bounded_frac = bound_claims(beh, old, claimed)  # [b, C], []
    bounded_frac = torch.where(claimed.any(), bounded_frac, math.nan)  # []
    if proximal == "behavior":  # peers' ratios measured against the sampler
        old = torch.where((tier != LOCAL)[:, None], beh, old)  # [b, C]
    return beh, old, bounded_frac


def _rows(x: LossInputs, rows: torch.Tensor) -> LossInputs:
    """The minibatch restricted to `rows` [b'] (logp keeps its gradient)."""
    return LossInputs(logp=x.logp[rows], old_logp=x.old_logp[rows], behavior_logp=x.behavior_logp[rows],
                      mask=x.mask[rows], advantages=x.advantages[rows], completion_budget=x.completion_budget,
                      row_weight=None if x.row_weight is None else x.row_weight[rows])


def _subset(groups: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    """The group codes [b'] of the host row positions `rows` [b'] (None stays None: sharing off)."""
    return None if groups is None else groups[rows]  # [b']
