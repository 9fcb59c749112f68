"""tasks.heldout_split: reasoning-gym held-out questions split from training by their text, and the
smollm2-arith preset built on it (node/tasks/reasoning_gym_source.py, node/config/presets.py)."""
from __future__ import annotations

import pytest

from node.config.schema import ConfigError, load_config
from node.tasks import UnknownTaskError, make_source
from node.tasks.base import question_is_heldout

# two one-digit terms: about 2,100 distinct question texts, so training draws repeat them often
SMALL = {"basic_arithmetic": {"weight": 1.0, "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                         "max_digits": 1}}}


def _training_questions(source, rounds: int = 200, per_round: int = 8) -> set[str]:
    return {t.question for r in range(rounds) for t in source.batch(r, per_round)}


def test_without_a_split_held_out_questions_repeat_training_ones():
    """The control: held-out differs from training by seed only, and this small config repeats texts."""
    source = make_source("reasoning_gym", SMALL, 0)
    heldout = {t.question for t in source.heldout(64)}
    assert len(heldout & _training_questions(source)) >= 5


def test_split_held_out_questions_are_distinct_and_never_drawn_for_training_at_any_seed():
    source = make_source("reasoning_gym", SMALL, 0, heldout_split=0.2)
    heldout = source.heldout(64)
    texts = [t.question for t in heldout]
    assert len(texts) == len(set(texts)) == 64
    assert all(question_is_heldout(q, 0.2) for q in texts)
    assert not set(texts) & _training_questions(source)
    peer = make_source("reasoning_gym", SMALL, 7, heldout_split=0.2)  # a peer's training seed
    assert not set(texts) & _training_questions(peer)
    # deterministic: a fresh source (another node) picks the same held-out questions
    again = make_source("reasoning_gym", SMALL, 0, heldout_split=0.2)
    assert [t.question for t in again.heldout(64)] == texts


def test_split_training_draws_are_deterministic_and_rebuildable_by_a_peer():
    ours = make_source("reasoning_gym", SMALL, 0, heldout_split=0.2)
    peer = make_source("reasoning_gym", SMALL, 0, heldout_split=0.2)
    batch = ours.batch(3, 8)
    assert [t.ref for t in batch] == [t.ref for t in peer.batch(3, 8)]
    assert [peer.rebuild(t.ref).question for t in batch] == [t.question for t in batch]


def test_a_peers_group_on_a_held_out_question_is_refused_at_any_seed():
    source = make_source("reasoning_gym", SMALL, 0, heldout_split=0.2)
    held = source.heldout(4)[0]
    with pytest.raises(UnknownTaskError, match="held out"):
        source.rebuild(held.ref)  # the held-out seed: a peer trying to train us on our own exam
    training_seed_index = next(i for i in range(10_000)
                               if question_is_heldout(source._build("basic_arithmetic", 0, i).question, 0.2))
    ref = source._build("basic_arithmetic", 0, training_seed_index).ref
    with pytest.raises(UnknownTaskError, match="held out"):
        source.rebuild(ref)


def test_split_values_and_sources_are_checked():
    with pytest.raises(ValueError, match="heldout_split"):
        make_source("reasoning_gym", SMALL, 0, heldout_split=0.9)
    with pytest.raises(ValueError, match="reasoning_gym"):
        make_source("synthetic", {"copy": 1.0}, 0, heldout_split=0.2)
    with pytest.raises(ConfigError, match="heldout_split"):
        load_config("tiny", None, ["tasks.heldout_split=0.2"])


def test_the_smollm2_arith_preset_holds_out_64_new_questions_and_an_ood_family():
    cfg = load_config("smollm2-arith")
    assert cfg.tasks.heldout_split > 0 and cfg.eval.tasks_per_family >= 64 and cfg.eval.ood
    assert cfg.sampling.answer_style == "direct" and cfg.eval.k == 8
    source = make_source(cfg.tasks.source, cfg.tasks.datasets, cfg.tasks.seed, heldout_split=cfg.tasks.heldout_split)
    heldout = source.heldout(cfg.eval.tasks_per_family)
    assert len({t.question for t in heldout}) == cfg.eval.tasks_per_family * len(cfg.tasks.datasets)
    assert not {t.question for t in heldout} & _training_questions(source, 100, cfg.tasks.prompts_per_round)
    ood = make_source(cfg.tasks.source, cfg.eval.ood, cfg.tasks.seed, heldout_split=cfg.tasks.heldout_split)
    assert len({t.question for t in ood.heldout(cfg.eval.tasks_per_family)}) == cfg.eval.tasks_per_family
    assert not set(cfg.eval.ood) & set(cfg.tasks.datasets)


def test_answer_style_reaches_sampling_and_the_retokenizer():
    """What our samples are drawn with is what a peer's answers are scored and trained under."""
    from node.scoring.verifiers import SYSTEM_PROMPTS
    from node.train.assembly import build_parts

    parts = build_parts(load_config("tiny", None, ["sampling.answer_style=direct"]))
    assert parts.sampling.system_prompt == parts.retokenizer.system_prompt == SYSTEM_PROMPTS["direct"]
    assert build_parts(load_config("tiny")).sampling.system_prompt == SYSTEM_PROMPTS["think"]
