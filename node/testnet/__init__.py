"""The testnet harness: honest swarm-node peers, and hostile ones from node/hostile/, run side by side on
one machine (the measurement labs are node/labs/, not the harness)."""
