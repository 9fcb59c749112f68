"""Watching a node: Prometheus /metrics, a live local web page at / and its JSON at /api/state, on one
read-only HTTP listener per node (swarm.metrics_listen, loopback by default), and one page for a
whole testnet. Modules: address (the listen setting), history (rounds from metrics.jsonl), state
(what a node exposes), prometheus (the collector), server (the listener), web (routes), testnet."""
