"""Identities are free: what do fresh keys and re-signed groups get out of a node, and what does a
TaskRef at an unknown seed cost it? (issue 9, items 4 and 9)

Three measurements, each on real parts: tiny-preset nodes that train, real signed envelopes through
the real Ingress and exchange on the in-process bus (node/service/assembly.py memory_bus_node).

  sybil     two honest tiny nodes share with a receiver for --warmup rounds; then --keys fresh keys
            each send one valid, honestly scored group of distinct content every round for --rounds
            rounds. Reported: the attacker keys' share of the receiver's external mix, and the
            honest peers' groups used per round.
  resign    one honest group is sent under --keys keys, --keys / 10 keys a round over 10 rounds.
            Reported: how many times the receiver trained on that content.
  seeds     reasoning-gym `acre` refs at seeds the node was not configured with (the digest
            matching each seed, as an attacker computes it). Reported: ms per rebuild (median).

    .venv/bin/python -m scripts.experiments.admission                 # all three, JSON on stdout
    .venv/bin/python -m scripts.experiments.admission --only seeds

Runs against whatever `node` it imports (the same script measured the code before and after: run
from the root of the checkout to measure).
"""
from __future__ import annotations

import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from scripts.common import arg_parser

SWARM = "adm"


class SwarmClock:
    """Swarm time for nodes taking turns on one CPU: every round lasts ROUND_S, whatever the wall
    clock says, so rate limits and publication pace see what a real swarm would send."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def next_round(self) -> None:
        self.t += ROUND_S


def _tiny_node(run_dir: Path, name: str, bus, extra=(), clock: SwarmClock | None = None):
    from node.config.schema import load_config
    from node.service.assembly import memory_bus_node

    cfg = load_config("tiny", None, ["run.threads=1", f"swarm.name={SWARM}", *extra])
    node = memory_bus_node(cfg, run_dir / name, bus, name, swarm_clock=clock)
    return node


def valid_group(node, task, rng: random.Random, round_index: int):
    """A well-formed group for `task` whose claimed rewards are the receiver's own: 1-3 of 4
    completions right, the others random wrong digits (text only, as a foreign model would send)."""
    from node.peers.wire import to_wire
    from node.train.groups import ScoredGroup
    from policy.types import Rollout
    from proto import swarm_pb2

    k = rng.randint(1, 3)
    texts = [task.answer] * k + [rng.choice([d for d in "0123456789" if d != task.answer]) for _ in range(4 - k)]
    rng.shuffle(texts)
    rewards = [node.verifier.score(task, node.source, t)[0] for t in texts]
    rollouts = [Rollout(prompt_ids=[], completion_ids=[], logprobs=None, text=t, offsets=[], truncated=False)
                for t in texts]
    group = ScoredGroup(task=task, rollouts=rollouts, rewards=rewards, correct=[r == 1.0 for r in rewards])
    return to_wire(group, round_index, swarm_pb2.ModelCard(name="sybil"), swarm_pb2.SamplingParams(temperature=1.0),
                   node.verifier.digest)


def content_of(group) -> str:
    """The content a re-signer copies: prompt and completion texts (independent of node.admission)."""
    return hashlib.sha256(repr((group.task.prompt_key, sorted(r.text for r in group.rollouts))).encode()).hexdigest()


# Honest peers must stay within their publication pace (10 msgs/s) and the Ingress's per-peer rate
# (20 msgs/s), or the run measures rate limiting instead of admission: 6 groups a 1-second round.
HONEST_PROMPTS = 6
ROUND_S = 1.0


def sybil_share(run_dir: Path, keys: int = 100, warmup: int = 24, rounds: int = 10, seed: int = 0,
                extra=()) -> dict:
    from protocol import MemoryBus, MemoryTransport, NodeIdentity, Outbox

    bus, clock = MemoryBus(), SwarmClock()
    receiver = _tiny_node(run_dir, "receiver", bus, extra, clock)
    honest = [_tiny_node(run_dir, f"honest{i}", bus, [f"run.seed={i + 1}", f"tasks.seed={i + 1}",
                                                      f"tasks.prompts_per_round={HONEST_PROMPTS}", *extra], clock)
              for i in range(2)]
    honest_ids = {h.exchange.peer_id for h in honest}
    for r in range(warmup):  # the honest peers have been around: they earn weight
        for h in honest:
            h.run_round(r)
        receiver.run_round(r)
        clock.next_round()
    outboxes = [Outbox(NodeIdentity.generate()) for _ in range(keys)]
    # each key under its own transport origin, as over GossipSub, where the sender picks the origin
    transports = [MemoryTransport(bus, f"sybil-{o.identity.peer_id()}") for o in outboxes]
    for transport in transports:
        transport.start()
    attacker_ids = {o.identity.peer_id() for o in outboxes}
    rng = random.Random(seed)
    used = Counter()
    honest_per_round = []
    t0 = time.perf_counter()
    for r in range(warmup, warmup + rounds):
        for h in honest:
            h.run_round(r)
        tasks = receiver.source.batch(10_000 + r, keys)
        for outbox, transport, task in zip(outboxes, transports, tasks):
            outbox.publish(transport, SWARM, valid_group(receiver, task, rng, r))
        receiver.run_round(r)
        by_sender = receiver.exchange.last_round["external_used_by_sender"]
        used["attacker"] += sum(n for s, n in by_sender.items() if s in attacker_ids)
        used["honest"] += sum(n for s, n in by_sender.items() if s in honest_ids)
        honest_per_round.append(sum(n for s, n in by_sender.items() if s in honest_ids))
        clock.next_round()
    total = used["attacker"] + used["honest"]
    return {"keys": keys, "warmup": warmup, "rounds": rounds, "attacker_used": used["attacker"],
            "honest_used": used["honest"], "attacker_share": used["attacker"] / total if total else 0.0,
            "honest_used_per_round": honest_per_round,
            "external_per_round": receiver.cfg.swarm.external_per_round,
            "rejected": dict(receiver.exchange.status()["rejected_by_reason"]),
            "attack_seconds": round(time.perf_counter() - t0, 2)}


def resign_count(run_dir: Path, keys: int = 100, rounds: int = 10, extra=()) -> dict:
    from protocol import MemoryBus, MemoryTransport, NodeIdentity, Outbox

    bus = MemoryBus()
    receiver = _tiny_node(run_dir, "receiver", bus, extra)
    group = valid_group(receiver, receiver.source.batch(5_000, 1)[0], random.Random(1), 0)
    outboxes = [Outbox(NodeIdentity.generate()) for _ in range(keys)]
    transports = [MemoryTransport(bus, f"resigner-{o.identity.peer_id()}") for o in outboxes]
    for transport in transports:
        transport.start()
    trained: list[str] = []
    collect = receiver.exchange.collect

    def recording_collect(*args, **kwargs):
        out = collect(*args, **kwargs)
        trained.extend(content_of(g) for g in out)
        return out

    receiver.exchange.collect = recording_collect
    per_round = max(1, keys // rounds)
    target = None
    for r in range(rounds):
        for i in range(r * per_round, min(keys, (r + 1) * per_round)):
            outboxes[i].publish(transports[i], SWARM, group)
        receiver.run_round(r)
        if target is None and trained:
            target = Counter(trained).most_common(1)[0][0]
    times = Counter(trained)[target] if target else 0
    return {"keys": keys, "rounds": rounds, "times_trained": times,
            "rejected": dict(receiver.exchange.status()["rejected_by_reason"])}


def unknown_seed_ms(n: int = 5) -> dict:
    from node.tasks.base import TaskRef
    from node.tasks.reasoning_gym_source import ReasoningGymSource

    source = ReasoningGymSource({"acre": 1.0}, seed=0)
    source.rebuild(source.batch(0, 1)[0].ref)  # our own seed: built once, as a running node has
    times, outcomes = [], Counter()
    for seed in range(1_000, 1_000 + n):
        ref = TaskRef("reasoning_gym", "acre", source.digest("acre", seed), seed, 3)
        t0 = time.perf_counter()
        try:
            source.rebuild(ref)
            outcomes["rebuilt"] += 1
        except ValueError:
            outcomes["refused"] += 1
        times.append((time.perf_counter() - t0) * 1000)
    return {"dataset": "acre", "seeds": n, "median_ms": round(statistics.median(times), 3),
            "max_ms": round(max(times), 3), "outcomes": dict(outcomes)}


def main(argv=None) -> int:
    p = arg_parser(__spec__, __doc__)
    p.add_argument("--only", choices=["sybil", "resign", "seeds"])
    p.add_argument("--keys", type=int, default=100)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=24)
    args = p.parse_args(argv)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "sybil"):
            out["sybil"] = sybil_share(Path(tmp) / "sybil", args.keys, args.warmup, args.rounds)
        if args.only in (None, "resign"):
            out["resign"] = resign_count(Path(tmp) / "resign", args.keys, args.rounds)
    if args.only in (None, "seeds"):
        out["seeds"] = unknown_seed_ms()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
