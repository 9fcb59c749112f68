"""The node, in rooms: config/ (typed settings), tasks/ (task sources), scoring/ (rewards), train/ (the
round loop), peers/ (the SAPO exchange and every check of a peer's message), observe/ (metrics, logs,
status, the live page), service/ (join, graceful stop), testnet/ (many nodes on one machine);
cli.py is the `swarm-node` command line."""
