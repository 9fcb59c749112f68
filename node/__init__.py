"""The node, in rooms: config/ (typed settings), tasks/ (task sources), scoring/ (rewards), train/ (the
round loop), peers/ (the SAPO exchange and every check of a peer's message), observe/ (metrics, logs,
status, the live page), service/ (the one assembly of a node, join, relay, graceful stop), hostile/
(peers that send bad traffic), testnet/ (the harness: many nodes on one machine), labs/ (the
measurements scripts/experiments/ drive), commands/ (one module per `swarm-node` verb); cli.py
dispatches to them. Below them all, ground/: stdlib-only plumbing (atomic writes, parent death, child
processes; policy/ and protocol/ keep their own beside them). This __init__ imports nothing, so
importing node.ground loads nothing else of node/ (tests/codebase/test_dependency_rule.py holds the
rooms to their floors)."""
