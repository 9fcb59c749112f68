"""The service behind `swarm-node join` (the verb: node/commands/join.py): one node of a swarm = the local
round loop + gossip (p2pd, py-libp2p or the in-process bus) + control service, assembled by
node/service/assembly.py."""
from __future__ import annotations

import os
import time
from pathlib import Path

from rich.console import Console

from node.config.schema import MAX_START_WAIT_S, ConfigError, NodeConfig
from node.observe.control import start_control_server
from node.observe.logs import json_lines, say
from node.observe.metrics import RoundTable
from node.observe.state import NodeObserver, loop_progress
from node.observe.web import announce, serve_node
from node.peers.exchange import SwarmExchange
from node.service.assembly import assemble_node
from node.service.network import build_transport, identity_path
from node.service.reach import ReachWatch
from node.service.shutdown import StopOnSignals
from node.train.assembly import build_parts
from node.train.loop import Node
from protocol import NodeIdentity, topic_name


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
        node = assemble_node(cfg, run_dir, transport, identity, parts=parts)
        exchange = node.exchange
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
