"""The service behind `swarm-node relay` (the verb: node/commands/relay.py): a box with a public address that helps home nodes in. It is a bootstrap
peer, a DHT server, an AutoNAT server and a circuit relay (swarm.nat), with no model and no gossip
topic: it trains nothing and never forwards the swarm's gossip, so it costs a few MB of memory and
whatever relayed traffic the relay's fixed limits allow (protocol/transports/p2pd/nat.py). Nodes behind NAT list it in
--peers (or swarm.relays) and reach each other through it (docs/joining-a-swarm.md "Joining from
behind NAT")."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from node.config.schema import ConfigError, NodeConfig
from node.observe.logs import say
from node.service.network import build_transport, identity_path
from node.service.reach import ReachWatch, reach_summary
from node.service.shutdown import StopOnSignals
from policy.ground import atomic_write_text
from protocol import NodeIdentity

STATUS_EVERY_S = 30.0  # a status line this often
RELAY_STATUS_FILE = "relay_status.json"  # the transport's counters, rewritten every STATS_EVERY_S
STATS_EVERY_S = 5.0


def relay(cfg: NodeConfig, run_dir: Path, console, quiet: bool = False) -> int:
    if cfg.swarm.transport != "p2pd":
        raise ConfigError(f"swarm.transport={cfg.swarm.transport!r}: relays run on the p2pd transport only")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    identity = NodeIdentity.load_or_generate(identity_path(cfg, run_dir))
    transport = build_transport(cfg, identity, run_dir, topics=[])
    transport.start()
    watch = ReachWatch(transport, console, run_dir, {"peer_id": identity.peer_id(), "pid": os.getpid(),
                                                     "swarm": cfg.swarm.name, "role": "relay"})
    try:
        watch.announce("joined", role="relay", transport="p2pd")
        watch.start()
        with StopOnSignals() as stop:
            said = time.monotonic()
            while not stop.wait(STATS_EVERY_S):
                stats = transport.stats()
                atomic_write_text(run_dir / RELAY_STATUS_FILE, json.dumps(stats, indent=1))
                if not quiet and time.monotonic() - said >= STATUS_EVERY_S:
                    said = time.monotonic()
                    say(console, f"{reach_summary(stats)}; connected peers {stats['connected_peers']}",
                        "relay_status", **{k: v for k, v in stats.items() if ":" not in k})
        say(console, "relay stopped by signal", "stopped")
    finally:
        watch.stop()
        transport.close()
    return 0
