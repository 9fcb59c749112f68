"""The tiny model's warm start (node/train/warm_start.py): the corpus, the cache, determinism, and the
node that loads it."""
from __future__ import annotations

import collections
import json
import random
from pathlib import Path

import pytest
import torch

from node.config.schema import load_config
from node.train.loop import Node
from node.tasks.synthetic import GENERATORS, SPLIT_FAMILIES, is_heldout_question
from node.config.sections import WarmStartConfig
from node.train.warm_start import NOISY_POSITIONS, cache_key, corpus_example, warm_model_config
from policy.models import ModelConfig, load_policy

FAST = WarmStartConfig(recipe="digits3", steps=5)
CLEAN = {  # the true answer of a split family's question, computed here independently
    "rev": lambda s: s[::-1],
    "inc": lambda s: "".join(str((int(c) + 1) % 10) for c in s),
    "rot": lambda s: s[1:] + s[0],
}
SUFFIX = {"rev": "m=", "inc": "+=", "rot": "=="}


def family_of(question: str) -> str:
    return next((f for f, suffix in SUFFIX.items() if question.endswith(suffix)), "copy")


def test_corpus_never_shows_a_heldout_question_and_noises_exactly_the_tail():
    rng = random.Random(7)
    noisy_digits = collections.defaultdict(set)
    families = collections.Counter()
    for _ in range(4000):
        question, answer = corpus_example(rng)
        family = family_of(question)
        families[family] += 1
        if family == "copy":
            assert question == f"{answer}=" and 1 <= len(answer) <= 4 and answer.isdigit()
            continue
        assert not is_heldout_question(question), question
        digits = question[:3]
        truth = CLEAN[family](digits)
        assert len(answer) == 3 and answer.isdigit()
        for i in range(3):
            if i in NOISY_POSITIONS[family]:
                noisy_digits[(family, i)].add(answer[i])
            else:
                assert answer[i] == truth[i], (question, answer)
    assert set(families) == {"copy", *SPLIT_FAMILIES} and min(families.values()) > 800
    assert set(noisy_digits) == {(f, i) for f, pos in NOISY_POSITIONS.items() for i in pos}
    assert all(len(seen) >= 8 for seen in noisy_digits.values())  # uniform noise, not the true digit
    # the generators agree with the independent answers above
    for family in SPLIT_FAMILIES:
        question, answer = GENERATORS[family](random.Random(1))
        assert answer == CLEAN[family](question[:3])


def test_recipe_none_is_the_model_itself_and_digits3_needs_the_tiny_model(tmp_path):
    model = ModelConfig(name="tiny", cache_dir=str(tmp_path))
    assert warm_model_config(WarmStartConfig(), model) is model
    with pytest.raises(ValueError, match="warm.recipe"):
        warm_model_config(FAST, ModelConfig(name="smollm2", cache_dir=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []  # nothing was built
    # the cache key follows everything the weights depend on
    keys = {cache_key(w, m) for w in (FAST, FAST.model_copy(update={"steps": 6}), FAST.model_copy(update={"seed": 1}))
            for m in (model, model.model_copy(update={"hidden_size": 32}))}
    assert len(keys) == 6


@pytest.fixture
def one_thread():
    """The builds are tiny: one thread is several times faster than two on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_policy(ModelConfig(name=str(folder))).model.state_dict()


def test_build_once_per_cache_dir_deterministically(tmp_path, one_thread):
    a, b = tmp_path / "a", tmp_path / "b"
    cfg_a = warm_model_config(FAST, ModelConfig(name="tiny", cache_dir=str(a)))
    folder = Path(cfg_a.name)
    assert folder.parent == a and (folder / "config.json").is_file()
    record = json.loads((folder / "warm_start.json").read_text())
    assert record["steps"] == 5 and record["seed"] == 0 and record["recipe"] == "digits3"
    assert set(record["greedy_heldout_pass1"]) == SPLIT_FAMILIES
    assert all(0.0 <= p <= 1.0 for p in record["greedy_heldout_pass1"].values())
    stamp = (folder / "config.json").stat().st_mtime_ns
    again = warm_model_config(FAST, ModelConfig(name="tiny", cache_dir=str(a)))
    assert again.name == cfg_a.name and (folder / "config.json").stat().st_mtime_ns == stamp  # not rebuilt
    cfg_b = warm_model_config(FAST, ModelConfig(name="tiny", cache_dir=str(b)))
    wa, wb = weights(folder), weights(Path(cfg_b.name))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)  # a function of the config
    assert not [p for d in (a, b) for p in d.iterdir() if p.name.startswith(".tmp-")]
    other = warm_model_config(FAST.model_copy(update={"seed": 1}), ModelConfig(name="tiny", cache_dir=str(a)))
    wo = weights(Path(other.name))
    assert any(not torch.equal(wa[k], wo[k]) for k in wa)  # another seed, another warm model


def test_a_tiny_warm_node_loads_the_warm_weights(tmp_path, one_thread):
    cfg = load_config("tiny-warm", None, ["warm.steps=5", f"model.cache_dir={tmp_path / 'cache'}", "run.threads=1",
                                          "tasks.prompts_per_round=1", "sampling.group_size=2"])
    node = Node(cfg, tmp_path / "run")
    warm = node.policy.model.state_dict()
    plain = load_policy(cfg.model).model.state_dict()  # the tiny init of the same shape
    assert warm.keys() == plain.keys() and all(warm[k].shape == plain[k].shape for k in warm)
    assert any(not torch.equal(warm[k], plain[k]) for k in warm)
    assert (Path(node.cfg.model.cache_dir) / f"tiny-warm-{cache_key(cfg.warm, cfg.model)}" / "warm_start.json").is_file()
