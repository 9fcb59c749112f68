"""The compute clock of the in-process testnet (`--clock compute`): every node runs on a device
profile, each round costs virtual seconds by the work it did, and nodes take turns in virtual-time
order, so a node that generates less per round (mix 2/6) or runs on a faster device does more rounds
in the same budget, as it would in a real swarm.

A round costs (every count from the round's metrics row, node/train/loop.py and node/peers/exchange.py)

    round_overhead_s                                   python, scoring, composing, the optimizer step
    + tokens_generated / gen_tokens_per_s              our own rollouts
    + generate_calls * generate_call_s                 each generate call's set-up (one a round, hinted
                                                       prompts included; DARS extras are calls of their own)
    + generate_steps * generate_step_s                 each decode step: a batch of up to the generator's
                                                       max_batch rows runs as many as its longest
                                                       completion needs, every row alike
    + generate_prompts * prompt_prefill_s              each distinct prompt, prefilled once
    + tokens_trained / train_tokens_per_s              every row trained, ours and peers'
    + tokens_forwarded * forward_token_s               the update's padded batch (prompt + completion of
                                                       every row trained), forward and backward
    + optimizer_steps * optimizer_step_s               each update's backward and optimizer step (a
                                                       round with nothing to train takes none)
    + groups_external * external_group_s               each peer group in the update (re-scored under
                                                       our policy beside our own groups)
    + messages_checked * message_check_s               every message received: signature, limits, replay
    + messages_skimmed * message_skim_s                every zero-variance group an established peer
                                                       sent, dropped after a skim (node/peers/skim.py)
    + groups_verified * group_verify_s                 every peer group re-verified (the mix's picks and
                                                       the audit): rebuild, re-score, re-tokenize, tier
    + messages_published * message_publish_s           every message we sign and publish
    + hint_generate_calls * generate_call_s            writing hints for peers' requests: generation
      + hint_generate_steps * generate_step_s          on our device, for them
      + hint_generate_prompts * prompt_prefill_s
      + hint_tokens_generated / gen_tokens_per_s

so a node pays for all the work sharing makes it do, measured on a swarm, not a lone node
(`scripts/tools/measure_profile.py` fits every rate on the rounds of every treatment the experiments
charge). The held-out evaluation is the measuring instrument: it is never charged. `--charge wall` charges each round's
measured wall time instead (scaled by the profile's speed): not repeatable, but it assumes no model.
"""
from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, replace

# Protocol time of a compute-clock testnet = this fixed, plausible Unix time + virtual seconds, so
# message timestamps, sequence numbers and replay windows look like a real swarm's, and runs repeat.
VIRTUAL_EPOCH = 1_700_000_000.0


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    gen_tokens_per_s: float
    train_tokens_per_s: float
    round_overhead_s: float = 0.0  # per round, whatever the work: python, scoring, the optimizer step
    generate_call_s: float = 0.0  # per generate call (ours or for a peer's hint)
    message_check_s: float = 0.0  # per message received and checked by the Ingress
    group_verify_s: float = 0.0  # per peer group re-verified
    message_publish_s: float = 0.0  # per message signed and published
    message_skim_s: float = 0.0  # per message skimmed and dropped unchecked
    optimizer_step_s: float = 0.0  # per optimizer step taken
    external_group_s: float = 0.0  # per peer (or replayed) group in the update
    generate_step_s: float = 0.0  # per decode step of a generator batch
    prompt_prefill_s: float = 0.0  # per distinct prompt generated for (its prefill)
    forward_token_s: float = 0.0  # per padded token of the update's batch
    speed: float = 1.0  # relative to the measured device: what `--charge wall` divides wall time by

    def scaled(self, factor: float, name: str) -> DeviceProfile:
        """A device `factor` times as fast at everything."""
        return replace(self, name=name, gen_tokens_per_s=self.gen_tokens_per_s * factor,
                       train_tokens_per_s=self.train_tokens_per_s * factor,
                       round_overhead_s=self.round_overhead_s / factor, generate_call_s=self.generate_call_s / factor,
                       message_check_s=self.message_check_s / factor, group_verify_s=self.group_verify_s / factor,
                       message_publish_s=self.message_publish_s / factor, message_skim_s=self.message_skim_s / factor,
                       optimizer_step_s=self.optimizer_step_s / factor, external_group_s=self.external_group_s / factor,
                       generate_step_s=self.generate_step_s / factor, prompt_prefill_s=self.prompt_prefill_s / factor,
                       forward_token_s=self.forward_token_s / factor, speed=self.speed * factor)


# The "fast" device per preset: one CPU thread of the machine the numbers were measured on, printed by
# `python -m scripts.tools.measure_profile --preset NAME` (a new preset is one more line). tiny-warm was fitted on
# the rounds of every treatment its experiments charge (every cost above, exchange included); tiny and
# smollm2 on a lone node (no exchange rates: their testnets charge no exchange work).
MEASURED: dict[str, DeviceProfile] = {
    "tiny": DeviceProfile("fast", gen_tokens_per_s=23750.0, train_tokens_per_s=5770.0, round_overhead_s=0.0055),
    # `python -m scripts.tools.measure_profile --preset tiny-warm --repeats 3` at `nice -n -19` (6,264 rounds: 4 nodes,
    # nine treatments (the skeptic's arms and its silo sweep's 16 and 32 prompts a round) in turn three times; 2-core
    # AMD EPYC VM, 2026-11-29, refitted when the clock began charging decode steps, prefilled prompts and the
    # update's padded batch): a decode step costs 2.2 ms whatever its rows (a 64-row batch: one step for all),
    # a prefilled prompt 0.46 ms, an optimizer step 10 ms; charged/wall on those rounds 0.95-1.05 per treatment
    # (the profile before this one: 0.90-1.45 on the same rounds)
    "tiny-warm": DeviceProfile("fast", gen_tokens_per_s=4.437e+05, train_tokens_per_s=1.144e+05,
                               round_overhead_s=0.000684, generate_call_s=0.00341, message_check_s=0.000533,
                               group_verify_s=0.00043, message_publish_s=8.34e-05, message_skim_s=0.000183,
                               optimizer_step_s=0.00997, external_group_s=0.000695, generate_step_s=0.00225,
                               prompt_prefill_s=0.000457, forward_token_s=1.18e-05),
    # measured with `python -m scripts.tools.measure_profile --preset smollm2 --set sampling.max_new_tokens=48`
    "smollm2": DeviceProfile("fast", gen_tokens_per_s=201.5, train_tokens_per_s=37.79, round_overhead_s=3.2),
    # `python -m scripts.tools.measure_profile --preset smollm2-arith --rounds 10` (64 counted rounds of 4 + 4 nodes,
    # shared-prefix training, idle machine): charged/wall 1.02 (8/0) and 0.98 (4/4) on those rounds
    "smollm2-arith": DeviceProfile("fast", gen_tokens_per_s=246.9, train_tokens_per_s=51.34, round_overhead_s=1.05,
                                   generate_call_s=1.59, message_check_s=0.00143, message_skim_s=0.000982),
}
SLOW_FACTOR = 0.5   # the heterogeneous testnet's slow nodes (plan.slowdown() == 2) run at half speed
GPU_FACTOR = 20.0   # a documentation profile: roughly a GPU against one CPU thread


def fast_profile(preset: str) -> DeviceProfile:
    profile = MEASURED.get(preset)
    if profile is None:
        raise ValueError(f"--clock compute: no measured device profile for preset {preset!r} (have: "
                         f"{', '.join(MEASURED)}). Run `python -m scripts.tools.measure_profile --preset {preset}` and add "
                         "the line it prints to MEASURED in node/testnet/clock.py, or use --clock rounds")
    return profile


def profiles(preset: str) -> dict[str, DeviceProfile]:
    fast = fast_profile(preset)
    return {"fast": fast, "slow": fast.scaled(SLOW_FACTOR, "slow"), "gpu": fast.scaled(GPU_FACTOR, "gpu")}


def generation_cost(row: dict, profile: DeviceProfile) -> float:
    """Virtual seconds of the round's own generation (before it exchanges with the swarm)."""
    return (row.get("tokens_generated", 0) / profile.gen_tokens_per_s
            + row.get("generate_calls", 0) * profile.generate_call_s
            + row.get("generate_steps", 0) * profile.generate_step_s
            + row.get("generate_prompts", 0) * profile.prompt_prefill_s)


def exchange_cost(row: dict, profile: DeviceProfile) -> float:
    """Virtual seconds of the round's exchange work: checking, verifying, publishing, hints for peers."""
    return (row.get("messages_checked", 0) * profile.message_check_s
            + row.get("groups_verified", 0) * profile.group_verify_s
            + row.get("messages_published", 0) * profile.message_publish_s
            + row.get("messages_skimmed", 0) * profile.message_skim_s
            + row.get("hint_generate_calls", 0) * profile.generate_call_s
            + row.get("hint_generate_steps", 0) * profile.generate_step_s
            + row.get("hint_generate_prompts", 0) * profile.prompt_prefill_s
            + row.get("hint_tokens_generated", 0) / profile.gen_tokens_per_s)


def round_cost(row: dict, profile: DeviceProfile, charge: str = "profile") -> float:
    """Virtual seconds one round took on `profile`, from its metrics row (module doc); charge="wall":
    its measured wall time (t_round, the held-out evaluation excluded) over the profile's speed."""
    if charge == "wall":
        return row["t_round"] / profile.speed
    return (profile.round_overhead_s + generation_cost(row, profile) + exchange_cost(row, profile)
            + training_cost(row, profile))


def training_cost(row: dict, profile: DeviceProfile) -> float:
    """Virtual seconds of the round's update (its fixed part is in round_overhead_s)."""
    return (row.get("tokens_trained", 0.0) / profile.train_tokens_per_s
            + row.get("optimizer_steps", 0.0) * profile.optimizer_step_s
            + row.get("groups_external", 0) * profile.external_group_s
            + row.get("tokens_forwarded", 0.0) * profile.forward_token_s)


def charged_over_wall(rows: list[dict], spent: str = "t_round") -> float | None:
    """What the clock charged over the wall time the rounds took (1.0: the profile charges what this
    machine spent; a mix far below 1 gets work for free). spent="t_round_cpu": over the CPU time of
    the round's thread instead, which another job on the machine barely changes (the memory testnet
    runs a node's round on one thread), so arms measured on a busy machine compare fairly."""
    counted = [r for r in rows if "cost_s" in r and spent in r]
    wall = sum(r[spent] for r in counted)
    return sum(r["cost_s"] for r in counted) / wall if wall > 0 else None


_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str, flag: str = "--budget") -> float:
    """'900', '900s', '30m', '2h', '1.5h' -> seconds (> 0)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)\s*", str(text))
    seconds = float(match[1]) * _UNITS[match[2]] if match else math.nan
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"{flag} expects a positive duration such as 900s, 30m or 2h (a plain number is "
                         f"seconds), got {text!r}")
    return seconds


class TurnQueue:
    """Whose turn it is: nodes ordered by the virtual instant their next round exchanges with the
    swarm (ties by node index, so runs repeat)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, float]] = []

    def push(self, exchange_at: float, index: int, start: float) -> None:
        heapq.heappush(self._heap, (exchange_at, index, start))

    def pop(self) -> tuple[int, float]:
        """(node index, its round's start)."""
        _, index, start = heapq.heappop(self._heap)
        return index, start

    def drop(self, index: int) -> None:
        self._heap = [item for item in self._heap if item[1] != index]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)


def full_round(prompts: int, group_size: int, max_new_tokens: int, max_batch: int = 64) -> dict[str, float]:
    """The work row of a full round: `prompts` x `group_size` rows, each generating and training
    `max_new_tokens`, in one generate call (batches of `max_batch` rows) and one optimizer step."""
    rows = prompts * group_size
    tokens = float(rows * max_new_tokens)
    return {"tokens_generated": tokens, "tokens_trained": tokens, "tokens_forwarded": tokens, "generate_calls": 1,
            "generate_steps": -(-rows // max_batch) * max_new_tokens, "generate_prompts": prompts,
            "optimizer_steps": 1}


def rate_time_scale(profile: DeviceProfile, work: dict[str, float], round_s: float) -> float:
    """How much faster than virtual time rate limits and publication pace run. They are sized for
    rounds of seconds (the rounds clock's tick, 2 s, lets a round's groups through); a tiny round is
    milliseconds of virtual time, so on virtual time every honest node would look like a flood. They
    run on virtual time stretched so that a fast node's full round (`work`, see full_round) lasts
    `round_s`; a faster round publishes proportionally faster, as it would."""
    return round_s / round_cost(work, profile)
