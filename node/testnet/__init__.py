"""The testnet harness: honest and hostile swarm-node peers run side by side on one machine."""
