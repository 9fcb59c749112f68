"""A testnet in one process: every node is a real Node on one protocol.MemoryBus (real signed messages,
the real Ingress and exchange). Deterministic for a seed, no sockets, and fast enough for the SAPO
table's many runs. Kills drop a node without a final checkpoint (as SIGKILL would) and rebuild it
from its run dir later.

Reproducible: identities derive from the seed (testnet_identity), every clock is virtual, every
random choice is seeded; two runs of one plan write the same metrics but for wall-time fields.

Two clocks (plan.clock):
  rounds   every node advances one round per tick (a slow node every 2nd tick) until --rounds; the
           bus, message timestamps, replay windows and peer scores run on ticks (TICK_S each).
  compute  every round costs virtual seconds on the node's device profile (node/testnet/clock.py);
           the node whose next exchange comes first in virtual time runs next, until the budget.
           A round runs at one virtual instant, its start + its generation time (estimated by the
           node's previous round, as the cost of this one is known only afterwards): it shares,
           collects and stamps its messages then, and peers see them --netem latency later.
           The MemoryBus, message timestamps, replay windows and peer scores run on virtual time;
           rate limits and publication pace on virtual time stretched (clock.rate_time_scale).
           Schedules (--kill, --partition) and hostile peers step with the swarm round, the most
           advanced node's. Every node's held-out pass@1 is measured on one virtual-time grid shared
           by every mix and seed, 0, s, 2s, ... and the budget, each point with the weights the node
           had at that instant (node/testnet/grid.py); the nodes' own eval.every evaluations are off.
"""
from __future__ import annotations

import gc
import hashlib
import json
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from node.config.schema import load_config
from node.observe.logs import node_log
from node.train.loop import Node
from node.service.assembly import memory_bus_node, solo_node
from node.service.network import IDENTITY_FILE
from node.testnet.clock import (VIRTUAL_EPOCH, TurnQueue, full_round, generation_cost, profiles, rate_time_scale,
                                round_cost)
from node.testnet.grid import GridEvaluator, grid_spacing
from node.hostile.peer import HostilePeer
from node.testnet.plan import Plan, frozen_nodes, halves, node_overrides, restart_event, slowdown
from policy.ground import atomic_write_text
from protocol import MemoryBus, MemoryTransport, NodeIdentity
from protocol.transports.impairment import parse_netem

# Rate limits and each node's publication pace run on swarm time here, one tick (a round) = 2 s:
# ticks run at whatever speed the machine allows (fast once only the slow nodes are left), so on the
# wall clock honest nodes would look like floods to each other and their outboxes would drop most
# groups. 2 s lets a tiny node's 16 groups a round through the default pace (10 messages/s).
TICK_S = 2.0
GRID_EVALS = "grid_evals.json"  # a node's held-out evaluations on the compute clock's grid, written as they happen


class MemoryTestnet:
    def __init__(self, plan: Plan, mix: tuple[int, int], seed: int, out: Path, dashboard=None,
                 budget_s: float | None = None):
        """`budget_s` (compute clock): virtual seconds to run; None: until every fast node has run
        plan.rounds rounds, the last of them finishing sets the budget (the runner's first run)."""
        self.plan, self.mix, self.seed, self.out = plan, mix, seed, Path(out)
        hf_logging.disable_progress_bar()  # one "Loading weights" bar per node would bury the live table
        self.dashboard = dashboard
        # the compute clock measures held-out pass@1 on its own grid (node/testnet/grid.py), not every eval.every rounds
        own_evals = ["eval.every=0"] if plan.clock == "compute" else []
        self.configs = [load_config(plan.preset, None, [*node_overrides(plan, i, seed, mix), *own_evals])
                        for i in range(plan.nodes)]
        self.tick = 0  # rounds clock: the tick; compute clock: the swarm round
        self.now = 0.0  # compute clock: virtual seconds
        self.budget_s = budget_s
        if plan.clock == "compute":
            devices = profiles(plan.preset)
            self.profiles = [devices["slow" if slowdown(plan, i) > 1 else "fast"] for i in range(plan.nodes)]
            cfg = self.configs[0]
            work = full_round(sum(plan.mixes[0]), cfg.sampling.group_size, cfg.sampling.max_new_tokens)
            scale = rate_time_scale(devices["fast"], work, TICK_S)
            self.protocol_clock = lambda: VIRTUAL_EPOCH + self.now
            self.swarm_clock = lambda: self.now * scale
            self.grid = GridEvaluator(grid_spacing(plan), plan.nodes)
            self.saved_evals = [0] * plan.nodes  # grid evaluations already in each node's GRID_EVALS file
        else:  # the bus, message stamps, replay windows and peer scores count ticks too, not wall seconds
            self.protocol_clock = lambda: VIRTUAL_EPOCH + self.tick * TICK_S
            self.swarm_clock = lambda: self.tick * TICK_S
        impairment = parse_netem(plan.netem) if plan.netem else None
        latency = (impairment.delay_s, impairment.delay_s + impairment.jitter_s) if impairment else (0.0, 0.0)
        self.bus = MemoryBus(loss=impairment.loss if impairment else 0.0, latency_s=latency, seed=seed,
                             clock=self.protocol_clock)
        # each node's bus name is its key's peer id, as a libp2p host's origin id is its signing key:
        # what a receiver may assume of an origin (node/peers/skim.py) holds here as on a real network
        self.bus_names = [derived_identity(f"{seed}/node{i}").peer_id() for i in range(plan.nodes)]
        measured = [self.bus_names[i] for i in range(plan.nodes) if i not in frozen_nodes(plan)]
        for name in measured if frozen_nodes(plan) else []:  # --frozen-peers: measured nodes hear frozen ones only
            self.bus.mute(name, measured)
        self.nodes: dict[int, Node] = {}
        self.down_until: dict[int, int] = {}
        self.restarts: set[int] = set()
        self.events: list[dict] = []
        self.hostile: list[HostilePeer] = []

    def run_dir(self, index: int) -> Path:
        return self.out / f"node{index}"

    def log_path(self, index: int) -> Path:
        """Node `index`'s log file: its records stay out of the live table (warnings still show)."""
        return self.run_dir(index) / "node.log"

    def _start(self, index: int) -> None:
        cfg = self.configs[index]
        if self.mix[1] > 0 and not cfg.swarm.self_replay:
            identity = testnet_identity(self.run_dir(index) / IDENTITY_FILE, f"{self.seed}/node{index}")
            node = memory_bus_node(cfg, self.run_dir(index), self.bus, identity.peer_id(), identity,
                                   swarm_clock=self.swarm_clock, clock=self.protocol_clock)
        else:  # a silo (J = 0, or J own earlier groups: swarm.self_replay) trains alone: no bus, no peers' hints
            node = solo_node(cfg, self.run_dir(index))
        with node_log(self.log_path(index)):
            resumed = node.resume()
        self.nodes[index] = node
        if index in self.restarts:
            self._event(restart_event(index, resumed))
        if self.plan.clock == "compute":  # (re)joins the turns now, its weights those it restarted from
            self.queue.push(self.now, index, self.now)
            self.grid.restarted(index)

    def _event(self, text: str) -> None:
        self.events.append({"tick": self.tick, "event": text,
                            **({"vtime": self.now} if self.plan.clock == "compute" else {})})

    def _kill(self, index: int, down: int) -> None:
        self.down_until[index] = self.tick + down
        self._event(f"node{index} killed at round {self.nodes[index].next_round}")
        if self.plan.clock == "compute":  # its points up to now, with the weights it has until now
            self.grid.down(index, self.nodes[index], self.now)
        release(self.nodes.pop(index))  # no final checkpoint: what a SIGKILL leaves behind
        if self.plan.clock == "compute":
            self.queue.drop(index)

    def _hostile_peers(self) -> None:
        cfg = self.configs[0]
        source, verifier = self.nodes[0].source, self.nodes[0].verifier
        for count, kind in self.plan.hostile:
            for j in range(count):
                transport = MemoryTransport(self.bus, f"hostile-{kind}-{j}")
                transport.start()
                self.hostile.append(HostilePeer(kind, transport, cfg.swarm.name, source, verifier,
                                                seed=self.seed * 100 + j, clock=self.protocol_clock))

    def _apply_schedule(self) -> None:
        for event in self.plan.kills:
            if event.at_round == self.tick:
                for index in event.nodes:
                    if index in self.nodes:
                        self._kill(index, event.down_rounds)
        for index, until in list(self.down_until.items()):
            if self.tick >= until:
                del self.down_until[index]
                self.restarts.add(index)
                self._start(index)
        for part in self.plan.partitions:
            if part.start == self.tick:
                a, b = halves(self.plan.nodes)
                self.bus.partition([self.bus_names[i] for i in a], [self.bus_names[i] for i in b])
                self._event(f"partition {a} | {b}")
            if part.end == self.tick:
                self.bus.heal()
                self._event("partition healed")

    def run(self) -> dict:
        torch.set_num_threads(1)
        started = time.perf_counter()
        self.queue = TurnQueue()
        try:
            for index in range(self.plan.nodes):
                self._start(index)
            self._hostile_peers()
            if self.plan.clock == "compute":
                return self._result(started, self._run_compute())
            while any(n.next_round < self.plan.rounds for n in self.nodes.values()) or self.down_until:
                self._run_tick()
            return self._result(started, {})
        finally:
            for index in list(self.nodes):
                release(self.nodes.pop(index))


    def _run_tick(self) -> None:
        """Rounds clock: every node due this tick runs one round."""
        self._apply_schedule()
        for peer in self.hostile:
            peer.step(self.tick)
        for index, node in sorted(self.nodes.items()):
            if node.next_round < self.plan.rounds and self.tick % slowdown(self.plan, index) == 0:
                with node_log(self.log_path(index)):
                    node.run_one(self.plan.rounds)
        if self.dashboard is not None:
            self.dashboard.update(self.snapshot())
        self.tick += 1

    def _run_compute(self) -> dict:
        """Rounds in virtual-time order until the budget; returns the run's compute-clock fields."""
        gen_estimate = [0.0] * self.plan.nodes
        finished: dict[int, float] = {}  # fast node -> when its plan.rounds-th round ended (derived budget)
        fast = [i for i, p in enumerate(self.profiles) if p.name == "fast"] or list(range(self.plan.nodes))
        while len(self.queue):
            index, start = self.queue.pop()
            if self.budget_s is not None and start >= self.budget_s:
                continue  # this node is done: its next round would start at or after the budget
            self.now = start + gen_estimate[index]
            node, profile = self.nodes[index], self.profiles[index]
            self.grid.before_round(index, node, start)  # settles its points before `start`
            self._save_grid_evals(index)
            with node_log(self.log_path(index)):
                row = node.run_one(self.plan.rounds,
                                   annotate=lambda r: _virtual_times(r, start, profile, self.plan.charge))
            end = row["vtime_end"]
            self.grid.after_round(index, start, end)
            gen_estimate[index] = generation_cost(row, profile)
            self.queue.push(end + gen_estimate[index], index, end)
            if node.next_round == self.plan.rounds and index in fast:
                finished[index] = end
                if self.budget_s is None and len(finished) == len(fast):
                    self.budget_s = max(finished.values())
            self._advance_swarm_round()
        self.now = self.budget_s
        for index in list(self.down_until):  # down at the end: back from its checkpoint to be evaluated
            del self.down_until[index]
            self._start(index)
        evals = {i: self.grid.finish(i, self.nodes[i], self.budget_s) for i in range(self.plan.nodes)}
        for index in evals:
            self._save_grid_evals(index, final=True)
        return {"clock": "compute", "budget_s": self.budget_s, "grid_s": self.grid.spacing, "evals": evals,
                "profiles": [p.name for p in self.profiles]}

    def _save_grid_evals(self, index: int, final: bool = False) -> None:
        """A node's grid evaluations so far, on disk as they happen (GRID_EVALS in its run dir): a run stopped
        before its budget (scripts/experiments/gpu_run.py's wall deadline) still shows the points it reached.
        `final`: the list the run reports (the grid's finish may add the budget's point and drop others)."""
        evals = self.grid.evals(index)
        if final or len(evals) != self.saved_evals[index]:
            atomic_write_text(self.run_dir(index) / GRID_EVALS, json.dumps(evals))
            self.saved_evals[index] = len(evals)

    def _advance_swarm_round(self) -> None:
        """Schedules and hostile peers step once per round of the swarm clock (the most advanced node's)."""
        swarm_round = max(node.next_round for node in self.nodes.values())
        while self.tick < swarm_round:
            self.tick += 1
            self._apply_schedule()
            for peer in self.hostile:
                peer.step(self.tick)
            if self.dashboard is not None:
                self.dashboard.update(self.snapshot())

    def _result(self, started: float, compute: dict) -> dict:
        statuses = {i: _status(node) for i, node in self.nodes.items()}
        evals, names = compute.pop("evals", {}), compute.pop("profiles", None)
        return {
            "transport": "memory", "mix": f"{self.mix[0]}/{self.mix[1]}", "seed": self.seed,
            "nodes": [{"index": i, "run_dir": str(self.run_dir(i)), "peer_id": statuses[i]["peer_id"],
                       "slowdown": slowdown(self.plan, i), "overrides": node_overrides(self.plan, i, self.seed, self.mix),
                       "status": _plain_status(statuses[i]),
                       **({"profile": names[i], "evals": evals[i]} if names else {})} for i in sorted(statuses)],
            "hostile": [{"kind": p.kind, "identities": p.identities(), "counters": dict(p.counters)} for p in self.hostile],
            "events": self.events, "seconds": time.perf_counter() - started, "bus": dict(self.bus.counters),
            "frozen": frozen_nodes(self.plan),
            **compute,
        }

    def snapshot(self) -> list[dict]:
        """One row per node for the live dashboard."""
        rows = []
        for index in range(self.plan.nodes):
            node = self.nodes.get(index)
            if node is None:
                rows.append({"node": index, "state": "killed"})
                continue
            last = node.metrics.last or {}
            status = _status(node)
            rows.append({"node": index, "state": "up", "round": node.next_round, "reward": last.get("reward_mean"),
                         "heldout": node.metrics.last_heldout, "peers": len(status["connected"]),
                         "accepted": status["accepted"], "rejected": sum(status["rejected_by_reason"].values()),
                         "ext_used": last.get("external_used")})
        return rows


def testnet_identity(path: Path, name: str) -> NodeIdentity:
    """The identity saved at `path` (a restarted node keeps its own), else one derived from `name`
    (seed and node), saved there: a run's peer ids, and with them the order in which peers' groups
    are sampled, repeat from run to run (a fresh random key made the swarm's figures vary)."""
    if path.exists():
        return NodeIdentity.load(path)
    identity = derived_identity(name)
    identity.save(path)
    return identity


def derived_identity(name: str) -> NodeIdentity:
    """The key a testnet derives for `name` (seed and node)."""
    return NodeIdentity.from_seed(hashlib.sha256(f"swarm-node testnet/{name}".encode()).digest())


def _virtual_times(row: dict, start: float, profile, charge: str) -> dict:
    """A round's virtual start and end (a held-out evaluation in the row is at its end)."""
    cost = round_cost(row, profile, charge)
    return {"vtime": start, "vtime_end": start + cost, "cost_s": cost}


def _status(node: Node) -> dict:
    """SwarmExchange.status(), or the same fields for a silo that has no exchange."""
    if node.exchange is not None:
        return node.exchange.status()
    return {"peer_id": None, "accepted": 0, "rejected_by_reason": {}, "used_by_sender": {}, "tiers_used": {},
            "transport": "none (silo)", "peers": [], "connected": []}


def _plain_status(status: dict) -> dict:
    """The JSON-able part of SwarmExchange.status()."""
    return {"peer_id": status["peer_id"], "accepted": status["accepted"],
            "rejected_by_reason": dict(status["rejected_by_reason"]), "used_by_sender": status["used_by_sender"],
            "tiers_used": status["tiers_used"], "transport": status["transport"],
            "peers": [{"peer_id": p.peer_id, "score": p.score, "banned": p.banned, "accepted": p.accepted,
                       "rejected": p.rejected} for p in status["peers"]]}


def release(node: Node) -> None:
    """Frees a node that leaves this process's testnet (killed, or its run ended) at once. Node and
    exchange refer to each other, and Python frees such a cycle only when its cyclic collector next
    runs, which a few large tensors do not trigger: a `--compare` sweep of SmolLM2 nodes held every
    finished run's models and optimizer states until the machine ran out of memory."""
    if node.exchange is not None:
        node.exchange.close()
        if getattr(node.exchange, "transport", None) is not None:  # a self-replay silo has none
            node.exchange.transport.close()
    node.close()
    del node  # our frame's reference is the last one outside the cycle
    gc.collect()
