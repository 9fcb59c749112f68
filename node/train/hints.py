"""Hints for prompts this node keeps failing (policy/ALGORITHMS.md, "Hints"): the receiving side.

A hint is context, never a training target. Levels, from least to most help:
    l1      the key idea                       (written by the solver's model; no final answer)
    l2      the method and an intermediate target
    l3      a detailed plan
    prefix  the first part of a verified-correct completion; its tokens are forced at the start
            of the completion and masked from the loss (PrefixRL style)

Life of a hint on the node that needs it:
  1. a local group for a prompt is all wrong -> HintRequest (at most once per `request_every`
     rounds per prompt, at most `max_requests_per_round` per round);
  2. hints that come back for a prompt we asked about are kept, one text per level (the first
     valid one wins); any other hint is counted as unsolicited and dropped;
  3. from then on that prompt is revisited (up to `revisits_per_round` per round) and every group
     for it keeps one unhinted completion while the other G-1 see the current level;
  4. help adapts to how the hinted completions fare: if they all fail, more help (the next level,
     or a longer prefix); if at least `ease_threshold` of them succeed, less help (the previous
     level, or a prefix `prefix_step` shorter: a reverse curriculum that hands the start of the
     solution back to the policy one piece at a time, until no prefix is left);
  5. hinting stops (anneals) for the prompt once its unhinted pass-rate posterior mean exceeds
     `anneal_threshold`, or when the prefix is used up; a prompt that is failed again later
     starts a new episode with the hints it holds.
"""
from __future__ import annotations

import re
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, field


from node.train.groups import HintUse, ScoredGroup
from node.train.pass_rates import PassRates
from node.tasks.base import Task, TaskRef
from node.config.sections import HintConfig

LEVELS = ("l1", "l2", "l3", "prefix")
ABSTRACT_LEVELS = LEVELS[:3]


def leaks_answer(text: str, answer: str | None) -> bool:
    """True when `text` contains the gold answer. Numbers match as whole numbers ('4' is not in
    '14' or '4.5'); other answers as case-insensitive substrings."""
    if answer is None or not answer.strip():
        return False
    gold = answer.strip()
    if re.fullmatch(r"-?\d+(?:\.\d+)?", gold):
        return re.search(rf"(?<![\d.]){re.escape(gold)}(?![\d]|\.\d)", text) is not None
    return gold.lower() in text.lower()


@dataclass
class HintState:
    ref: dict  # TaskRef.to_dict() of the prompt's first failing draw (what a revisit rebuilds)
    levels: dict[str, str] = field(default_factory=dict)  # level -> text
    level: int = 0  # index into LEVELS: the least helpful level still worth trying
    prefix_chars: int | None = None  # characters of the prefix hint in use (None: all of it)
    requested_round: int = -(10**9)
    revisits: int = 0
    last_revisit: int = -(10**9)
    done: bool = False  # annealed or given up


class HintBook:
    """Per-prompt hint state of this node; checkpointed with the run."""

    def __init__(self, cfg: HintConfig, pass_rates: PassRates, usable_levels: tuple[str, ...]):
        self.cfg = cfg
        self.pass_rates = pass_rates
        self.usable_levels = usable_levels  # levels this model can condition on
        self.states: OrderedDict[str, HintState] = OrderedDict()
        self.counters: Counter[str] = Counter()

    # -- asking ------------------------------------------------------------------------------
    def requests(self, groups: list[ScoredGroup], round_index: int) -> list[Task]:
        """Tasks to send a HintRequest for: unhinted groups with no correct completion. A prompt
        whose hinting had stopped (annealed, or prefix used up) but that is failed again starts
        over with the hints it already holds."""
        out: list[Task] = []
        for group in groups:
            if group.hint is not None or any(group.correct):
                continue
            key = group.task.prompt_key
            state = self.states.get(key)
            if state is None:
                state = self._track(key, HintState(ref=group.task.ref.to_dict()))
            if state.done:
                posterior = self.pass_rates.prompt(key)
                if posterior is not None and posterior.mean > self.cfg.anneal_threshold:
                    continue
                state.done, state.level, state.prefix_chars, state.revisits = False, 0, None, 0
                self.counters["prompts_reengaged"] += 1
            if self._has_usable(state) or round_index - state.requested_round < self.cfg.request_every:
                continue
            if len(out) >= self.cfg.max_requests_per_round:
                continue
            state.requested_round = round_index
            self.counters["requests_sent"] += 1
            out.append(group.task)
        return out

    def _track(self, key: str, state: HintState) -> HintState:
        self.states[key] = state
        while len(self.states) > self.cfg.max_tracked:
            self.states.popitem(last=False)
        return state

    # -- receiving ---------------------------------------------------------------------------
    def add(self, task: Task, level: str, text: str) -> bool:
        """Keep a verified hint if we asked for this prompt and have no text for that level yet."""
        state = self.states.get(task.prompt_key)
        if state is None or state.done:
            self.counters["hints_unsolicited"] += 1
            return False
        if level not in self.usable_levels:
            self.counters["hints_unusable"] += 1
            return False
        if level in state.levels:
            self.counters["hints_duplicate"] += 1
            return False
        state.levels[level] = text
        self.counters["hints_accepted"] += 1
        return True

    # -- using -------------------------------------------------------------------------------
    def current(self, task: Task) -> HintUse | None:
        """The hint to condition G-1 completions of `task` on, or None."""
        state = self.states.get(task.prompt_key)
        if state is None or state.done:
            return None
        level = self._level(state)
        if level is None:
            return None
        text = state.levels[level]
        if level == "prefix" and state.prefix_chars is not None:
            text = text[: state.prefix_chars]
        return HintUse(level, text)

    def _level(self, state: HintState) -> str | None:
        """The least helpful usable level at or above the state's escalation step."""
        for level in LEVELS[state.level:]:
            if level in state.levels and level in self.usable_levels:
                return level
        return None

    def revisits(self, round_index: int, exclude: set[str]) -> list[TaskRef]:
        """Hinted prompts to add to this round's batch (least recently revisited first); each is
        revisited at most `max_revisits` times per hinting episode (it is still hinted whenever
        the task stream draws it)."""
        candidates = [(s.last_revisit, key, s) for key, s in self.states.items()
                      if key not in exclude and not s.done and s.revisits < self.cfg.max_revisits
                      and self._has_usable(s)]
        chosen = sorted(candidates, key=lambda c: (c[0], c[1]))[: self.cfg.revisits_per_round]
        for _, _, state in chosen:
            state.revisits += 1
            state.last_revisit = round_index
        return [TaskRef.from_dict(s.ref) for _, _, s in chosen]

    def _has_usable(self, state: HintState) -> bool:
        return self._level(state) is not None

    def observe(self, group: ScoredGroup) -> None:
        """After scoring: adapt the help to how the hinted completions fared; anneal when the
        unhinted pass rate (posterior mean, updated by the caller) is high enough."""
        state = self.states.get(group.task.prompt_key)
        if state is None or state.done:
            return
        if group.hint is not None:
            self.counters[f"groups_hinted_{group.hint.level}"] += 1
            hinted_ok = [c for c, h in zip(group.correct, group.hinted) if h]
            if hinted_ok and not any(hinted_ok):
                self._more_help(state, group.hint)
            elif hinted_ok and sum(hinted_ok) >= self.cfg.ease_threshold * len(hinted_ok):
                self._less_help(state, group.hint)
        posterior = self.pass_rates.prompt(group.task.prompt_key)
        if posterior is not None and posterior.mean > self.cfg.anneal_threshold:
            state.done = True
            self.counters["prompts_annealed"] += 1

    def _step(self, state: HintState) -> int:
        return max(1, round(len(state.levels["prefix"]) * self.cfg.prefix_step))

    def _more_help(self, state: HintState, used: HintUse) -> None:
        self.counters["escalations"] += 1
        full = len(state.levels.get("prefix", ""))
        if used.level == "prefix" and state.prefix_chars is not None and state.prefix_chars < full:
            state.prefix_chars = min(full, state.prefix_chars + self._step(state))
        elif used.level != "prefix":
            state.level = LEVELS.index(used.level) + 1  # the next level (asks again if there is none)

    def _less_help(self, state: HintState, used: HintUse) -> None:
        self.counters["deescalations"] += 1
        if used.level != "prefix":
            state.level = max(0, LEVELS.index(used.level) - 1)
            return
        shorter = len(used.text) - self._step(state)
        if shorter <= 0:  # the whole solution is the policy's own again
            state.done = True
            self.counters["prefixes_used_up"] += 1
        else:
            state.prefix_chars = shorter

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"states": [(k, asdict(s)) for k, s in self.states.items()], "counters": dict(self.counters)}

    def load_state_dict(self, state: dict) -> None:
        self.states = OrderedDict((k, HintState(**s)) for k, s in state.get("states", []))
        self.counters = Counter(state.get("counters", {}))
