"""The measurement labs that scripts/experiments/ drive (and tests check in part), beside the harness,
not in it: honest-heard (issue 31: honest_heard.py, honest_heard_run.py; driven by
scripts/experiments/honest_heard.py) and the NAT lab (netns.py, nat_run.py, relay_latency.py,
relay_probe.py; driven by scripts/experiments/nat.py). Processes they start run as `python -m
node.labs.relay_probe` and `python -m node.hostile.flood_origins`. They use hostile peers and a
node's services, never the testnet harness."""
