"""Running the node as a service: `swarm-node join` (join.py), a graceful stop (shutdown.py), the
command line's console and re-exec state (console.py); child processes' environment comes from
policy/ground.py (child_env)."""
