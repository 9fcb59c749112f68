"""The suite's helpers, imported by path (`from tests.support.waiting import wait_until`): the environment
and ending of child processes, waiting, a fake clock, tiny nodes, hidden modules, env files, the
memory probe run as a subprocess, and the fork server of warm `python -m node.cli` children
(warm_children.py; its client is warm_site/sitecustomize.py, put on the children's PYTHONPATH)."""
