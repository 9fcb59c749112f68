"""Shared by the end-to-end tests: a tiny-preset config and a node run for some rounds."""
from node.config.schema import load_config
from node.train.loop import Node
from node.observe.metrics import RoundTable, read_metrics


def tiny_cfg(*overrides):
    return load_config("tiny", None, ["run.threads=1", *overrides])


def run_node(cfg, run_dir, rounds, resume=False):
    node = Node(cfg, run_dir)
    if resume:
        node.resume()
    node.run(rounds, RoundTable("test", quiet=True))
    return read_metrics(run_dir)
