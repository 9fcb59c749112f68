"""One module per `swarm-node` verb: each holds its arguments (`add_parser`) and its command (`run`), and
imports what the command needs inside `run` (the reason beside each), so building the parser never
loads torch, transformers or a transport. node/cli.py only dispatches. The verbs call the services
below them: node/service/assembly.py builds a node (parts, exchange, Node) for train, eval, join and
the memory testnet alike; node/service/join.py and relay.py run one; node/testnet/runner.py runs many.
common.py holds the options the config-building verbs share."""
