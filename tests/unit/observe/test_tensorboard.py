"""run.tensorboard: the event files a tiny node writes hold metrics.jsonl's values, one per round and
metric, flushed every round, and a resumed run leaves no duplicated or contradictory steps.

The files are read back with TensorBoard's own EventAccumulator where the `tensorboard` package is
installed, else with the TFRecord reader of node/observe/tensorboard.py (which the node itself uses)."""
from collections import Counter

import numpy as np
import pytest

from node.train.loop import Node
from node.observe.metrics import RoundTable, read_metrics
from node.observe.tensorboard import TB_DIR, event_files, read_records, read_scalars, scalars

from tests.support.tiny_node import tiny_cfg

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    EventAccumulator = None


def shown(directory) -> dict[str, dict[int, float]]:
    """tag -> step -> value, as a viewer shows it; fails on a (tag, step) written twice."""
    if EventAccumulator is not None:
        acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
        acc.Reload()
        out = {tag: {} for tag in acc.Tags()["scalars"]}
        for tag in out:
            for event in acc.Scalars(tag):
                assert event.step not in out[tag], f"{tag} step {event.step} shown twice"
                out[tag][event.step] = event.value
        return out
    return {tag: {step: value for step, (_, value) in steps.items()} for tag, steps in read_scalars(directory).items()}


def written_pairs(directory) -> Counter:
    """(tag, step) -> how many times it is in the event files on disk (any reader would see them all)."""
    from tensorboardX.proto.event_pb2 import Event

    pairs = Counter()
    for path in event_files(directory):
        for record in read_records(path):
            event = Event.FromString(record)
            pairs.update((v.tag, event.step) for v in event.summary.value)
    return pairs


def assert_mirrors_metrics(run_dir) -> None:
    rows = read_metrics(run_dir)
    expected = {}
    for row in rows:
        for tag, value in scalars(row).items():
            expected.setdefault(tag, {})[row["round"]] = float(np.float32(value))  # simple_value is a float32
    got = shown(run_dir / TB_DIR)
    assert set(got) == set(expected), set(got) ^ set(expected)
    for tag, steps in expected.items():
        assert got[tag] == pytest.approx(steps, nan_ok=True), tag
    assert max(written_pairs(run_dir / TB_DIR).values()) == 1  # nothing hidden by a purge either


def test_every_round_is_written_flushed_and_equal_to_metrics_jsonl(tmp_path):
    cfg = tiny_cfg("run.tensorboard=true", "eval.every=2", "eval.tasks_per_family=2", "eval.k=2")
    node = Node(cfg, tmp_path)
    try:
        for round_index in range(4):
            row = node.run_one(4)
            on_disk = read_scalars(tmp_path / TB_DIR)  # before close: a live TensorBoard sees it now
            assert on_disk["reward_mean"][round_index][1] == pytest.approx(row["reward_mean"], rel=1e-6)
    finally:
        node.close()
    rows = read_metrics(tmp_path)
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    got = shown(tmp_path / TB_DIR)
    assert sorted(got["pass_rate_by_dataset/copy"]) == [0, 1, 2, 3]  # nested dicts are flattened
    assert sorted(got["heldout_pass1"]) == [1, 3]  # held-out evaluation rounds carry the held-out metrics
    assert sorted(got["heldout_by_family/ood:add/pass1"]) == [1, 3]  # the never-trained family too
    assert "round" not in got and "tasks_digest" not in got  # the step, and a string
    assert_mirrors_metrics(tmp_path)
    assert len(event_files(tmp_path / TB_DIR)) == 1


def test_a_resumed_run_shows_each_round_once_with_the_values_that_continued(tmp_path):
    """A node killed after round 5 with its last checkpoint at round 3: the restarted node runs 4 and
    5 again; TensorBoard must not keep the lost run's 4 and 5 beside the new ones."""
    cfg = tiny_cfg("run.tensorboard=true", "run.checkpoint_every=4")
    crashed = Node(cfg, tmp_path)
    for _ in range(6):
        crashed.run_one(100)  # checkpoint after round 3 only; never closed: what a kill leaves
    lost = read_metrics(tmp_path)
    before = read_scalars(tmp_path / TB_DIR)
    assert sorted(before["t_round"]) == [0, 1, 2, 3, 4, 5]

    node = Node(cfg, tmp_path)
    assert node.resume() == 3
    node.run(8, RoundTable("test", quiet=True))
    node.close()
    rows = read_metrics(tmp_path)
    assert [r["round"] for r in rows] == list(range(8))
    assert rows[4]["t_round"] != lost[4]["t_round"]  # the rerun's own values, so a stale one would show
    assert_mirrors_metrics(tmp_path)
    after = read_scalars(tmp_path / TB_DIR)
    assert after["t_round"][4][1] == pytest.approx(rows[4]["t_round"], rel=1e-6)
    for step in range(4):  # rounds the checkpoint kept keep their wall times
        assert after["t_round"][step][0] == pytest.approx(before["t_round"][step][0])
    assert after["t_round"][4][0] > before["t_round"][5][0]  # the rerun is later than what it replaced
    assert len(event_files(tmp_path / TB_DIR)) == 1


def test_switching_tensorboard_on_later_backfills_the_earlier_rounds(tmp_path):
    node = Node(tiny_cfg("run.checkpoint_every=2"), tmp_path)
    node.run(2, RoundTable("test", quiet=True))
    node.close()
    assert not (tmp_path / TB_DIR).exists()  # off by default
    node = Node(tiny_cfg("run.checkpoint_every=2", "run.tensorboard=true"), tmp_path)
    node.resume()
    node.run(3, RoundTable("test", quiet=True))
    node.close()
    assert sorted(shown(tmp_path / TB_DIR)["reward_mean"]) == [0, 1, 2]
    assert_mirrors_metrics(tmp_path)
