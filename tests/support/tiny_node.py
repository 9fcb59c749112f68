"""Shared by the end-to-end tests: a tiny-preset config and a node run for some rounds."""
from node.config.schema import load_config
from node.train.loop import Node
from node.observe.metrics import RoundTable, read_metrics


def tiny_cfg(*overrides, threads: int | None = 1):
    """The tiny preset with `overrides`, after "run.threads=1" unless `threads` is None (the tests'
    `tiny_config` fixture is this function)."""
    return load_config("tiny", None, [*([] if threads is None else [f"run.threads={threads}"]), *overrides])


def run_node(cfg, run_dir, rounds, resume=False):
    node = Node(cfg, run_dir)
    if resume:
        node.resume()
    node.run(rounds, RoundTable("test", quiet=True))
    return read_metrics(run_dir)
