"""Watching a node: per-round metrics and the live round table (metrics.py), logs (logs.py), TensorBoard
scalars (tensorboard.py), `swarm-node report` plots (report.py), the gRPC status service (control.py),
and one read-only HTTP listener per node (swarm.metrics_listen, loopback by default) with Prometheus
/metrics, a live page at / and its JSON at /api/state: address (the listen setting), history (rounds
from metrics.jsonl), state (what a node exposes), prometheus, server, web (routes), testnet (one page
for a whole testnet)."""
