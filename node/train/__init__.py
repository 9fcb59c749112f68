"""Where a round happens: the round loop (loop.py) and what it is built from (assembly.py); sampling and
scoring a round's groups (rollouts.py, prompts.py, allocation.py: DARS), scored groups and their
composition (groups.py), pass rates, hints (hints.py: asking, hint_writer.py: answering), held-out
evaluation (eval.py) and the tiny model's warm start (warm_start.py)."""
