"""The one assembly of a node: its parts (node/train/assembly.py build_parts), its exchange and the `Node`.

    assemble_node(cfg, run_dir)                          no transport: the silo (self-replay's or none)
    assemble_node(cfg, run_dir, transport, identity)     the swarm's exchange over that transport

`swarm-node train` and `eval` (node/commands/), `join` (node/service/join.py) and the memory testnet
(node/testnet/memory.py, through memory_bus_node and solo_node) all build their nodes here, so a node
is put together the same way wherever it runs; only the transport differs."""
from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path
from typing import Callable

from node.config.schema import NodeConfig
from node.peers.exchange import SwarmExchange
from node.peers.exchange_options import ExchangeOptions
from node.peers.operator import OperatorWatch
from node.peers.self_replay import silo_exchange
from node.peers.verify import VerifyContext
from node.scoring.sandbox import ScorerSandbox
from node.train.assembly import NodeParts, build_parts, saved_exchange_state
from node.train.loop import Node
from node.train.prompts import Retokenizer
from protocol import MemoryTransport, NodeIdentity


def assemble_node(cfg: NodeConfig, run_dir: Path, transport=None, identity: NodeIdentity | None = None, *,
                  parts: NodeParts | None = None, ingest: str | None = None,
                  swarm_clock: Callable[[], float] | None = None, clock: Callable[[], float] = time.time) -> Node:
    """A node of `cfg` in `run_dir`. Without a transport it trains without peers: its exchange is the
    self-replay silo's with swarm.self_replay (node/peers/self_replay.py), else none. With one (started),
    its exchange is the swarm's, signed by `identity`, holding the admission state of the checkpoint it
    will resume from (build_exchange says what ingest, swarm_clock and clock change)."""
    parts = parts or build_parts(cfg)
    if transport is None:
        return Node(cfg, run_dir, silo_exchange(cfg, parts.pass_rates), parts=parts)
    exchange = build_exchange(parts, identity or NodeIdentity.generate(), transport, saved_exchange_state(run_dir),
                              ingest, swarm_clock, clock, run_dir)
    return Node(cfg, run_dir, exchange, parts=parts)


def build_exchange(parts: NodeParts, identity: NodeIdentity, transport, state: dict | None = None,
                   ingest: str | None = None, swarm_clock: Callable[[], float] | None = None,
                   clock: Callable[[], float] = time.time, run_dir: Path | None = None) -> SwarmExchange:
    """The swarm's exchange, built from the node's parts (node/train/assembly.py); `state`: the admission
    state saved with the checkpoint the node resumes from (assembly.saved_exchange_state);
    `ingest` overrides swarm.ingest.mode (the memory testnet runs inline);
    `swarm_clock`: the time rate limits and publication pace run on (default the wall clock);
    `clock`: the time messages are stamped and checked on; `run_dir`: where the operator's decisions
    about peers' keys are kept (node/peers/operator.py; None: no operator)."""
    if parts.cfg.swarm.self_replay:
        raise ValueError("swarm.self_replay is a silo control: a node with peers cannot replay itself instead")
    options = ExchangeOptions.from_config(parts.cfg, parts.policy.tokenizer_fingerprint, ingest=ingest,
                                          clock=clock, swarm_clock=swarm_clock)
    return SwarmExchange(transport, identity, verify_context(parts, options.ingest), options,
                         weakness=parts.pass_rates.weakness, state=state,
                         operator=None if run_dir is None else OperatorWatch(run_dir))


def verify_context(parts: NodeParts, ingest: str) -> VerifyContext:
    """What the exchange verifies peers' messages with, built once: our task source, verifier and
    tokenizer, the length caps (swarm.max_external_tokens; a group holds at most 2 * group_size
    completions' worth) and a scorer sandbox."""
    cfg = parts.cfg
    retokenizer = parts.retokenizer
    if ingest == "background":  # a fast tokenizer used from two threads at once can raise "Already borrowed"
        private = dataclasses.replace(parts.policy, tokenizer=copy.deepcopy(parts.policy.tokenizer))
        retokenizer = Retokenizer(private, retokenizer.eos_ids, retokenizer.system_prompt)
    max_tokens = cfg.max_external_tokens
    # started on first use: a node whose scorers are all string comparisons never starts a worker
    sandbox = ScorerSandbox((cfg.tasks.source, cfg.tasks.datasets, cfg.tasks.seed))
    return VerifyContext(parts.source, parts.verifier, retokenizer, max_completion_tokens=max_tokens,
                         max_group_tokens=2 * max_tokens * cfg.sampling.group_size, sandbox=sandbox,
                         accept_sender_answers=cfg.swarm.accept_sender_answers)


def memory_bus_node(cfg: NodeConfig, run_dir: Path, bus, name: str, identity: NodeIdentity | None = None,
                    ingest: str = "inline", swarm_clock: Callable[[], float] | None = None,
                    clock: Callable[[], float] = time.time) -> Node:
    """A node joined to a protocol.MemoryBus as peer `name` (tests, experiments, and simulations that
    run many nodes in one process): the same exchange as `join`, another transport. Call `resume()`
    on it to continue its run (its exchange already holds the admission state of that checkpoint).
    Ingest is inline by default: verification happens in collect(), in swarm time, so simulations
    are deterministic. Pass `swarm_clock` (e.g. rounds as seconds) when nodes take turns on one CPU:
    on the wall clock their rate limits and publication pace would see bursts no real swarm sends.
    `clock` (default the wall clock) stamps and checks messages: a virtual-time testnet passes its own,
    the same as the MemoryBus's."""
    parts = build_parts(cfg)
    transport = MemoryTransport(bus, name)
    transport.start()
    return assemble_node(cfg, run_dir, transport, identity, parts=parts, ingest=ingest, swarm_clock=swarm_clock,
                         clock=clock)


def solo_node(cfg: NodeConfig, run_dir: Path, parts: NodeParts | None = None) -> Node:
    """A node that trains without peers (the memory testnet's silos): assemble_node without a transport."""
    return assemble_node(cfg, run_dir, parts=parts)
