"""The node, in rooms: config/ (typed settings), tasks/ (task sources), scoring/ (rewards), train/ (the
round loop), peers/ (the SAPO exchange and every check of a peer's message), observe/ (metrics, logs,
status, the live page), service/ (the one assembly of a node, join, relay, graceful stop), hostile/
(peers that send bad traffic), testnet/ (the harness: many nodes on one machine), labs/ (the
measurements scripts/experiments/ drive), commands/ (one module per `swarm-node` verb); cli.py
dispatches to them. Its stdlib plumbing (atomic writes, parent death, a child's environment) is
policy/ground.py's, and stopping children protocol/ground.py's. This __init__ imports nothing
(tests/codebase/test_dependency_rule.py holds the rooms to their floors)."""
