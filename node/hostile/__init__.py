"""Hostile peers: the kinds of bad traffic a swarm must survive (peer.py, attacks.py), one such peer
as its own process (`python -m node.hostile.process`) and K flooding origins in one process
(`python -m node.hostile.flood_origins`). The testnet harness (node/testnet/) and the measurement labs
(node/labs/) start them; they import nothing of either."""
