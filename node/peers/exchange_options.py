"""How a SwarmExchange (node/peers/exchange.py) runs: `ExchangeOptions`, derived from the config once.

The exchange gets two objects besides its transport and key: a node/peers/verify.py `VerifyContext`
(what verifying a peer's message needs: task source, verifier, retokenizer, length caps, scorer
sandbox) and these options (what it publishes as, how it mixes, pools, admits and ingests, and the
clocks it runs on). `from_config` reads them from a NodeConfig; tests and experiments replace a
field with `dataclasses.replace`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Literal

from node.config.schema import NodeConfig
from node.config.swarm import AdmissionConfig, PoolConfig
from node.peers.audit import AUDIT_MAX_BYTES
from node.peers.ingest import IngestBudget
from node.peers.pool import SamplingPolicy
from proto import swarm_pb2
from protocol import Limits

INGEST_MODES = ("inline", "background")


@dataclass(frozen=True)
class ExchangeOptions:
    """`ingest`: "background" (a worker thread, `swarm-node join`) or "inline" (in collect: the
    in-process testnet, deterministic). `clock`: the time messages are stamped and checked on (a
    compute-clock testnet's virtual time); `swarm_clock`: the time rate limits and our publication
    pace run on (None: the wall clock; an in-process simulation passes its swarm time, as its nodes
    share one CPU)."""

    swarm: str = "main"  # swarm.name: the gossip topics
    model: swarm_pb2.ModelCard = field(default_factory=swarm_pb2.ModelCard)  # what our groups say we run
    sampling: swarm_pb2.SamplingParams = field(default_factory=swarm_pb2.SamplingParams)  # how we sampled them
    seed: int = 0  # the mix's own RNG stream (never the training RNG)
    external_per_round: int = 4  # J
    audit_per_round: int = 2
    audit_max_bytes: int = AUDIT_MAX_BYTES  # the audit memory's bound (node/peers/audit.py)
    verify_budget_s: float = 0.5  # the training thread's verification seconds per round (collect)
    sampling_policy: SamplingPolicy = "per_sender"
    composition: Literal["sapo", "cross_actor"] = "sapo"
    pool: PoolConfig = field(default_factory=PoolConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    ingest: Literal["inline", "background"] = "inline"
    budget: IngestBudget = IngestBudget()  # background ingest's
    limits: Limits = field(default_factory=Limits)  # what the Ingress and our outbox enforce
    clock: Callable[[], float] = time.time
    swarm_clock: Callable[[], float] | None = None
    trusted_keys: frozenset[str] = frozenset()  # the operator's --peers and swarm.relays (admission's bootstrap)

    def __post_init__(self) -> None:
        if self.ingest not in INGEST_MODES:
            raise ValueError(f"ingest must be 'inline' or 'background', got {self.ingest!r}")

    @classmethod
    def from_config(cls, cfg: NodeConfig, tokenizer_fingerprint: str, *, ingest: str | None = None,
                    clock: Callable[[], float] = time.time,
                    swarm_clock: Callable[[], float] | None = None) -> ExchangeOptions:
        """The options of a node with config `cfg` whose tokenizer has that fingerprint; `ingest`
        overrides swarm.ingest.mode (the memory testnet runs inline)."""
        s = cfg.swarm
        return cls(swarm=s.name, seed=cfg.run.seed,
                   model=swarm_pb2.ModelCard(name=cfg.model.name[:64], tokenizer_fingerprint=tokenizer_fingerprint),
                   sampling=swarm_pb2.SamplingParams(temperature=cfg.sampling.temperature,
                                                     max_new_tokens=cfg.sampling.max_new_tokens),
                   external_per_round=s.external_per_round, audit_per_round=s.audit_per_round,
                   audit_max_bytes=s.audit_max_bytes, verify_budget_s=s.verify_budget_s,
                   sampling_policy=s.sampling_policy, composition=s.composition, pool=s.pool,
                   admission=s.admission, ingest=ingest or s.ingest.mode, budget=IngestBudget.from_config(s.ingest),
                   clock=clock, swarm_clock=swarm_clock, trusted_keys=named_keys([*s.peers, *s.relays]))


def named_keys(addrs: list[str]) -> frozenset[str]:
    """The peer ids that multiaddrs ending in /p2p/<peer-id> name (others name none)."""
    return frozenset(addr.rstrip("/").rsplit("/p2p/", 1)[1] for addr in addrs if "/p2p/" in addr)
