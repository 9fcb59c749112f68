"""What a testnet runs: the plan from the command line, schedules, and each node's own settings.

Schedules count rounds of the swarm clock (the most advanced honest node's round in process mode and
with the memory testnet's compute clock; the tick with its rounds clock):
    --kill "150:1,2,3:40"        at round 150 SIGKILL nodes 1, 2 and 3; restart them 40 rounds later
    --partition "100-200"        from round 100 to 200 the two halves of the swarm cannot hear each other
    --hostile "2:liar"           two hostile peers of that kind beside the honest nodes
    --model-sizes "64x2,96x3"    tiny nodes of these widths x layers, in turn (node 0 64x2, node 1 96x3, ...)
    --frozen-peers               a control: the second half of the nodes never update (optim.lr = 0) and the
                                 first half (the measured nodes) hear only them (frozen_nodes)
Several events are separated by ';' (kill) or ',' (partition, hostile).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from node.config.presets import PRESETS
from node.testnet.clock import fast_profile

# task families a node can specialise in, per preset
FAMILIES = {"tiny": ["copy", "succ", "max"], "tiny-warm": ["rev", "inc", "rot"]}
LR_FACTORS = (1.0, 0.7, 1.4, 0.85)  # heterogeneous learning rates (x the preset's)
SLOW_EVERY = 4  # every 4th node runs at half speed


@dataclass(frozen=True)
class KillEvent:
    at_round: int
    nodes: tuple[int, ...]
    down_rounds: int


@dataclass(frozen=True)
class Partition:
    start: int
    end: int


@dataclass
class Plan:
    nodes: int = 3
    rounds: int = 200
    preset: str = "tiny"
    mixes: list[tuple[int, int]] = field(default_factory=lambda: [(4, 4)])
    seeds: int = 1
    hostile: list[tuple[int, str]] = field(default_factory=list)
    kills: list[KillEvent] = field(default_factory=list)
    partitions: list[Partition] = field(default_factory=list)
    netem: str | None = None
    transport: str = "p2pd"  # what `join` defaults to (measured faster than py-libp2p at every N)
    heterogeneous: bool = True
    overrides: list[str] = field(default_factory=list)
    out: Path = Path("runs/testnet")
    min_round_s: float = 0.25  # process mode: pacing, so gossip arrives between rounds
    timeout_s: float = 1800.0  # process mode: a run that does not finish in time is stopped
    model_sizes: list[tuple[int, int]] = field(default_factory=list)  # tiny (hidden, layers) per node, cycled
    clock: str = "rounds"  # memory mode: "rounds" (one round per node per tick) or "compute" (node/testnet/clock.py)
    budget_s: float | None = None  # compute clock: virtual seconds every node runs (None: derived, see runner)
    charge: str = "profile"  # compute clock: "profile" (counted work on the device profile) or "wall"
    grid_s: float | None = None  # compute clock: held-out evaluation spacing (None: node/testnet/grid.py's)
    duration_s: float | None = None  # process mode: wall seconds every node runs (instead of --rounds)
    frozen_peers: bool = False  # memory mode: the second half never updates; the first hears only it

    def validate(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}: valid presets are {', '.join(PRESETS)}")
        if self.nodes < 1 or self.rounds < 1 or self.seeds < 1:
            raise ValueError("--nodes, --rounds and --seeds must be >= 1")
        if self.transport not in ("p2pd", "libp2p", "memory"):
            raise ValueError(f"--transport must be p2pd, libp2p or memory, got {self.transport!r}")
        for event in self.kills:
            bad = [i for i in event.nodes if not 0 <= i < self.nodes]
            if bad:
                raise ValueError(f"--kill names nodes {bad}, but nodes are numbered 0..{self.nodes - 1}")
        for part in self.partitions:
            if not 0 <= part.start < part.end:
                raise ValueError(f"--partition {part.start}-{part.end}: need 0 <= start < end")
            if self.nodes < 2:
                raise ValueError("--partition needs at least 2 nodes")
        if self.clock not in ("rounds", "compute"):
            raise ValueError(f"--clock must be rounds or compute, got {self.clock!r}")
        if self.charge not in ("profile", "wall"):
            raise ValueError(f"--charge must be profile or wall, got {self.charge!r}")
        if self.grid_s is not None and (self.clock != "compute" or not self.grid_s > 0):
            raise ValueError("--grid is a positive virtual-time spacing of the compute clock's evaluations")
        if self.charge == "wall" and self.clock != "compute":
            raise ValueError("--charge wall is how the compute clock charges a round: it needs --clock compute")
        if self.clock == "compute":
            if self.transport != "memory":
                raise ValueError("--clock compute runs on the in-process testnet (--transport memory); "
                                 "process testnets run on the wall clock (see --duration)")
            fast_profile(self.preset)  # a clear error now rather than after the first run
        if self.budget_s is not None and self.clock != "compute":
            raise ValueError("--budget is virtual time: it needs --clock compute")
        if self.duration_s is not None and self.transport == "memory":
            raise ValueError("--duration is wall time for process testnets; the memory testnet takes --budget")
        if self.duration_s is not None and self.duration_s >= self.timeout_s:
            raise ValueError(f"--duration ({self.duration_s:g} s) must be shorter than --timeout ({self.timeout_s:g} s)")
        if self.frozen_peers and (self.transport != "memory" or self.nodes < 2):
            raise ValueError("--frozen-peers needs --transport memory and at least 2 nodes (half of them frozen)")
        if self.model_sizes and PRESETS[self.preset]["model"]["name"] != "tiny":
            raise ValueError(f"--model-sizes shapes the tiny model; preset {self.preset!r} has one size")


def parse_mix(text: str) -> tuple[int, int]:
    local, sep, external = text.partition("/")
    if not (sep and local.isdigit() and external.isdigit() and int(local) > 0):
        raise ValueError(f"a mix is I/J with I >= 1 local and J >= 0 external groups (e.g. 4/4), got {text!r}")
    return int(local), int(external)


def parse_kills(text: str | None) -> list[KillEvent]:
    events = []
    for part in filter(None, (p.strip() for p in (text or "").split(";"))):
        match = re.fullmatch(r"(\d+):([\d,]+)(?::(\d+))?", part)
        if match is None:
            raise ValueError(f"--kill expects ROUND:NODE,NODE[:DOWN_ROUNDS] (e.g. 150:1,2,3:40), got {part!r}")
        nodes = tuple(int(n) for n in match.group(2).split(",") if n)
        events.append(KillEvent(int(match.group(1)), nodes, int(match.group(3) or 30)))
    return events


def parse_partitions(text: str | None) -> list[Partition]:
    out = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        match = re.fullmatch(r"(\d+)-(\d+)", part)
        if match is None:
            raise ValueError(f"--partition expects START-END rounds (e.g. 100-200), got {part!r}")
        out.append(Partition(int(match.group(1)), int(match.group(2))))
    return out


def parse_sizes(text: str | None) -> list[tuple[int, int]]:
    """'64x2,96x3' -> [(64, 2), (96, 3)]: tiny model widths x layers (widths divisible by 4 heads)."""
    out = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        match = re.fullmatch(r"(\d+)x(\d+)", part)
        if not match or int(match[1]) % 4 or int(match[1]) == 0 or int(match[2]) == 0:
            raise ValueError(f"--model-sizes expects WIDTHxLAYERS with the width a positive multiple of 4 "
                             f"(the tiny model's heads), e.g. 64x2,96x3; got {part!r}")
        out.append((int(match[1]), int(match[2])))
    return out


def parse_hostile(text: str | None) -> list[tuple[int, str]]:
    from node.hostile.peer import KINDS  # the protocol and scorers: only when --hostile is given

    out = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        count, sep, kind = part.partition(":")
        if not (sep and count.isdigit()) or kind not in KINDS:
            raise ValueError(f"--hostile expects COUNT:KIND with KIND one of {', '.join(KINDS)}, got {part!r}")
        out.append((int(count), kind))
    return out


def node_overrides(plan: Plan, index: int, seed: int, mix: tuple[int, int]) -> list[str]:
    """The --set overrides of honest node `index` for one run: its own seeds, its mix, and (when
    heterogeneous) its own learning rate, task emphasis and speed."""
    local, external = mix
    base = PRESETS[plan.preset]
    out = [f"run.seed={seed * 1000 + index}", f"model.init_seed={seed * 1000 + index}",
           f"tasks.seed={seed * 1000 + index}", f"tasks.prompts_per_round={local}",
           f"tasks.peer_seeds=[{', '.join(str(seed * 1000 + i) for i in range(plan.nodes))}]",  # reasoning-gym
           f"swarm.external_per_round={external}", f"run.rounds={node_rounds(plan)}", "run.threads=1",
           "run.checkpoint_every=10"]  # a killed node loses at most 10 rounds
    if external == 0:
        out.append("hints.enabled=false")  # a silo asks no peer for hints
    if base.get("warm", {}).get("recipe", "none") != "none":
        out.append(f"warm.seed={seed}")  # one warm model per seed, shared by all nodes (SAPO: one checkpoint)
    if plan.heterogeneous:
        lr = base.get("optim", {}).get("lr", 1e-3) * LR_FACTORS[index % len(LR_FACTORS)]
        out.append(f"optim.lr={lr:g}")
        families = FAMILIES.get(plan.preset)
        if families:  # a specialist: mostly its own family, a little of the others
            main = families[index % len(families)]
            weights = ", ".join(f"{f} = {0.85 if f == main else 0.15 / (len(families) - 1):.3f}" for f in families)
            out.append(f"tasks.datasets={{{weights}}}")
    if plan.model_sizes:  # same tokenizer, other shapes: peers' log-probs stay tier 0
        hidden, layers = plan.model_sizes[index % len(plan.model_sizes)]
        out += [f"model.hidden_size={hidden}", f"model.num_layers={layers}"]
    if index in frozen_nodes(plan):  # after --set: no override may unfreeze it
        return [*out, *plan.overrides, "optim.lr=0"]
    return [*out, *plan.overrides]


def frozen_nodes(plan: Plan) -> list[int]:
    """--frozen-peers: the nodes that never update, the second half. They generate, share, collect
    and run every update as any peer would (so they keep a peer's pace on the compute clock), at a
    learning rate of 0: their weights stay the warm start's. The first half, the measured nodes,
    hear only them (MemoryBus.mute); the report leaves them out of its tables."""
    return halves(plan.nodes)[1] if plan.frozen_peers else []


def node_rounds(plan: Plan) -> int:
    """The rounds a node is told to run: --rounds, or (--duration) more than it can before it is stopped."""
    return 10**6 if plan.duration_s is not None else plan.rounds


def restart_event(index: int, checkpoint_round: int | None) -> str:
    """The report's line for a node brought back after a kill."""
    where = "round 0 (no checkpoint yet)" if checkpoint_round is None else f"its checkpoint of round {checkpoint_round}"
    return f"node{index} restarted from {where}"


def slowdown(plan: Plan, index: int) -> int:
    """How many swarm ticks one round of node `index` takes (heterogeneous speed; the compute clock
    gives a node with slowdown 2 the "slow" device profile, half as fast)."""
    return 2 if plan.heterogeneous and plan.nodes > 1 and index % SLOW_EVERY == SLOW_EVERY - 1 else 1


def halves(n: int) -> tuple[list[int], list[int]]:
    return list(range(n // 2)), list(range(n // 2, n))
