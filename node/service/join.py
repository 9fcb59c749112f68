"""The service behind `swarm-node join` (the verb: node/commands/join.py): one node of a swarm = the local
round loop + gossip (p2pd, py-libp2p or the in-process bus) + control service."""
from __future__ import annotations

import copy
import dataclasses
import os
import time
from pathlib import Path
from typing import Callable

from rich.console import Console

from node.train.assembly import NodeParts, build_parts, saved_exchange_state
from node.config.schema import MAX_START_WAIT_S, ConfigError, NodeConfig
from node.observe.control import start_control_server
from node.peers.exchange import SwarmExchange
from node.peers.exchange_options import ExchangeOptions
from node.peers.operator import OperatorWatch
from node.peers.self_replay import silo_exchange
from node.peers.verify import VerifyContext
from node.observe.logs import json_lines, say
from node.train.loop import Node
from node.observe.metrics import RoundTable
from node.observe.state import NodeObserver, loop_progress
from node.observe.web import announce, serve_node
from node.train.prompts import Retokenizer
from node.scoring.sandbox import ScorerSandbox
from node.service.reach import ReachWatch
from node.service.shutdown import StopOnSignals
from node.service.network import build_transport, identity_path
from protocol import MemoryTransport, NodeIdentity, topic_name

def build_exchange(parts: NodeParts, identity: NodeIdentity, transport, state: dict | None = None,
                   ingest: str | None = None, swarm_clock: Callable[[], float] | None = None,
                   clock: Callable[[], float] = time.time, run_dir: Path | None = None) -> SwarmExchange:
    """The exchange `join` uses, built from the node's parts (node/train/assembly.py); `state`: the admission
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
    exchange = build_exchange(parts, identity or NodeIdentity.generate(), transport, saved_exchange_state(run_dir),
                              ingest, swarm_clock, clock, run_dir)
    return Node(cfg, run_dir, exchange, parts=parts)


def solo_node(cfg: NodeConfig, run_dir: Path, parts: NodeParts | None = None) -> Node:
    """A node that trains without peers (`swarm-node train` and `eval`, the memory testnet's silos): its
    exchange is the self-replay silo's with swarm.self_replay (node/peers/self_replay.py), else none."""
    parts = parts or build_parts(cfg)
    return Node(cfg, run_dir, silo_exchange(cfg, parts.pass_rates), parts=parts)


def snapshot(node: Node, exchange: SwarmExchange, started: float) -> dict:
    """Everything `swarm-node status` shows."""
    return {**exchange.status(), "round": node.next_round, "uptime_s": time.monotonic() - started,
            "policy_version": node.learner.policy_version,
            "hints": {**node.hints.counters, **node.hint_writer.counters}}


def join(cfg: NodeConfig, run_dir: Path, console: Console, quiet: bool = False) -> int:
    if cfg.swarm.self_replay:
        raise ConfigError("swarm.self_replay is a silo control that joins no network: run it with "
                          "`swarm-node train` or the memory testnet (docs/testnets-and-experiments.md "
                          "\"Controls: is it the peers' knowledge?\")")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    identity = NodeIdentity.load_or_generate(identity_path(cfg, run_dir))
    parts = build_parts(cfg)
    say(console, f"rollouts: {parts.backend_line}", "backend")

    transport = build_transport(cfg, identity, run_dir, [topic_name(cfg.swarm.name, "rollouts")])
    if cfg.swarm.fault_file:  # a testnet injects delay, loss and partitions through this file
        from protocol.transports.impairment import ImpairedTransport

        transport = ImpairedTransport(transport, Path(cfg.swarm.fault_file), seed=cfg.run.seed)
    transport.start()  # returns once listening; never waits for peers
    try:
        exchange = build_exchange(parts, identity, transport, saved_exchange_state(run_dir), run_dir=run_dir)
        node = Node(cfg, run_dir, exchange, parts=parts)
        node.resume()  # a restarted node continues its own run (logged: event "resume")
    except BaseException:  # an unreadable checkpoint: stop the daemon we started before saying so
        transport.close()
        raise
    started = time.monotonic()

    server, control = start_control_server(
        cfg.swarm.control, lambda: {**snapshot(node, exchange, started), "transport_name": cfg.swarm.transport})
    title = f"swarm-node join ({cfg.model.name}, swarm {cfg.swarm.name})"
    observe = serve_node(cfg.swarm.metrics_listen, NodeObserver(
        run_dir, title, {"peer_id": identity.peer_id(), "swarm": cfg.swarm.name, "transport": cfg.swarm.transport},
        loop_progress(node), exchange.status, started))
    watch = ReachWatch(transport, console, run_dir, {
        "peer_id": identity.peer_id(), "control": control, "metrics": observe.address if observe else None,
        "pid": os.getpid(), "swarm": cfg.swarm.name})
    watch.announce("joined", swarm=cfg.swarm.name, transport=cfg.swarm.transport, next_round=node.next_round)
    watch.start()
    say(console, f"control service on {control} (swarm-node status --run-dir {run_dir})", "control", control=control)
    announce(observe, console, "metrics (/metrics) and live page")
    try:
        with StopOnSignals() as stop:  # SIGTERM (systemctl/docker stop): finish the round, checkpoint, exit 0
            if cfg.run.start_at is not None and node.next_round == 0:  # an orchestrated launch: start together
                stop.wait(min(MAX_START_WAIT_S, max(0.0, cfg.run.start_at - time.time())))
            node.run(cfg.run.rounds, RoundTable(title, console=console, quiet=quiet, log_rounds=json_lines()), stop)
        if stop.is_set():
            say(console, f"stopped by signal after round {node.next_round - 1}; checkpoint of that round in "
                         f"{run_dir / 'checkpoints'}", "stopped", round=node.next_round - 1)
    finally:
        watch.stop()
        if observe is not None:
            observe.stop()
        server.stop(grace=1.0)
        exchange.close()
        transport.close()
        node.close()
    return 0
