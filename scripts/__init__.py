"""The project's experiment and benchmark drivers, run as modules from the repository root
(`.venv/bin/python -m scripts.experiments.skeptic --quick`): bench/ (gossip/, policy/, round_cost,
sender_lockout), experiments/, tools/; common.py holds what they share. The shell scripts beside
them (setup.sh, test.sh, gen_proto.sh, demo.sh) and deploy/ are run as files."""
