"""Running the node as a service: `swarm-node join` (join.py), a graceful stop (shutdown.py), the
command line's console and re-exec state (console.py); child processes' environment is the ground
floor's (node/ground/child_env.py)."""
