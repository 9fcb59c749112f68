"""A testnet in one process: every node is a real Node on one protocol.MemoryBus (real signed messages,
the real Ingress and exchange), advanced round-robin, one tick at a time. Deterministic for a seed,
no sockets, and fast enough for the SAPO table's many runs. Kills drop a node without a final
checkpoint (as SIGKILL would) and rebuild it from its run dir later."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from node.config import load_config
from node.loop import Node
from node.swarm import IDENTITY_FILE, join_memory_bus
from node.testnet.hostile import HostilePeer
from node.testnet.plan import Plan, halves, node_overrides, restart_event, slowdown
from protocol import MemoryBus, MemoryTransport, NodeIdentity
from protocol.impairment import parse_netem

# Rate limits and each node's publication pace run on swarm time here, one tick (a round) = 2 s:
# ticks run at whatever speed the machine allows (fast once only the slow nodes are left), so on the
# wall clock honest nodes would look like floods to each other and their outboxes would drop most
# groups. 2 s lets a tiny node's 16 groups a round through the default pace (10 messages/s).
TICK_S = 2.0


class MemoryTestnet:
    def __init__(self, plan: Plan, mix: tuple[int, int], seed: int, out: Path, dashboard=None):
        self.plan, self.mix, self.seed, self.out = plan, mix, seed, Path(out)
        self.dashboard = dashboard
        impairment = parse_netem(plan.netem) if plan.netem else None
        latency = (impairment.delay_s, impairment.delay_s + impairment.jitter_s) if impairment else (0.0, 0.0)
        self.bus = MemoryBus(loss=impairment.loss if impairment else 0.0, latency_s=latency, seed=seed)
        self.configs = [load_config(plan.preset, None, node_overrides(plan, i, seed, mix)) for i in range(plan.nodes)]
        self.nodes: dict[int, Node] = {}
        self.down_until: dict[int, int] = {}
        self.restarts: set[int] = set()
        self.events: list[dict] = []
        self.hostile: list[HostilePeer] = []

    def run_dir(self, index: int) -> Path:
        return self.out / f"node{index}"

    def _start(self, index: int) -> None:
        cfg = self.configs[index]
        node = Node(cfg, self.run_dir(index))
        resumed = node.resume()
        identity = NodeIdentity.load_or_generate(self.run_dir(index) / IDENTITY_FILE)
        join_memory_bus(node, self.bus, f"node{index}", identity, swarm_clock=lambda: self.tick * TICK_S)
        self.nodes[index] = node
        if index in self.restarts:
            self.events.append({"tick": self.tick, "event": restart_event(index, resumed)})

    def _kill(self, index: int, down: int) -> None:
        node = self.nodes.pop(index)
        node.exchange.transport.close()  # no final checkpoint: what a SIGKILL leaves behind
        self.down_until[index] = self.tick + down
        self.events.append({"tick": self.tick, "event": f"node{index} killed at round {node.next_round}"})

    def _hostile_peers(self) -> None:
        cfg = self.configs[0]
        source, verifier = self.nodes[0].source, self.nodes[0].verifier
        for count, kind in self.plan.hostile:
            for j in range(count):
                transport = MemoryTransport(self.bus, f"hostile-{kind}-{j}")
                transport.start()
                self.hostile.append(HostilePeer(kind, transport, cfg.swarm.name, source, verifier, seed=self.seed * 100 + j))

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
                self.bus.partition([f"node{i}" for i in a], [f"node{i}" for i in b])
                self.events.append({"tick": self.tick, "event": f"partition {a} | {b}"})
            if part.end == self.tick:
                self.bus.heal()
                self.events.append({"tick": self.tick, "event": "partition healed"})

    def run(self) -> dict:
        torch.set_num_threads(1)
        started = time.perf_counter()
        self.tick = 0
        for index in range(self.plan.nodes):
            self._start(index)
        self._hostile_peers()
        while any(n.next_round < self.plan.rounds for n in self.nodes.values()) or self.down_until:
            self._apply_schedule()
            for peer in self.hostile:
                peer.step(self.tick)
            for index, node in sorted(self.nodes.items()):
                if node.next_round < self.plan.rounds and self.tick % slowdown(self.plan, index) == 0:
                    node.run_one(self.plan.rounds)
            if self.dashboard is not None:
                self.dashboard.update(self.snapshot())
            self.tick += 1
        statuses = {i: node.exchange.status() for i, node in self.nodes.items()}
        return {
            "transport": "memory", "mix": f"{self.mix[0]}/{self.mix[1]}", "seed": self.seed,
            "nodes": [{"index": i, "run_dir": str(self.run_dir(i)), "peer_id": statuses[i]["peer_id"],
                       "slowdown": slowdown(self.plan, i), "overrides": node_overrides(self.plan, i, self.seed, self.mix),
                       "status": _plain_status(statuses[i])} for i in sorted(statuses)],
            "hostile": [{"kind": p.kind, "identities": p.identities(), "counters": dict(p.counters)} for p in self.hostile],
            "events": self.events, "seconds": time.perf_counter() - started, "bus": dict(self.bus.counters),
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
            status = node.exchange.status()
            rows.append({"node": index, "state": "up", "round": node.next_round, "reward": last.get("reward_mean"),
                         "heldout": node.metrics.last_heldout, "peers": len(status["connected"]),
                         "accepted": status["accepted"], "rejected": sum(status["rejected_by_reason"].values()),
                         "ext_used": last.get("external_used")})
        return rows


def _plain_status(status: dict) -> dict:
    """The JSON-able part of SwarmExchange.status()."""
    return {"peer_id": status["peer_id"], "accepted": status["accepted"],
            "rejected_by_reason": dict(status["rejected_by_reason"]), "used_by_sender": status["used_by_sender"],
            "tiers_used": status["tiers_used"], "transport": status["transport"],
            "peers": [{"peer_id": p.peer_id, "score": p.score, "banned": p.banned, "accepted": p.accepted,
                       "rejected": p.rejected} for p in status["peers"]]}
