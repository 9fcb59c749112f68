"""Peer scores: weights, decay, bans that grow on repeat and expire, bounded memory."""
from __future__ import annotations

import pytest

from protocol.errors import Reason
from protocol.scoring import ACCEPTED, WRONG_REWARD, PeerScores, ScoreConfig

from tests.support.fake_clock import FakeClock


def test_events_move_the_score_and_positive_credit_is_capped():
    scores = PeerScores(ScoreConfig(max_score=1.0), FakeClock())
    for _ in range(100):
        scores.record("good", ACCEPTED)
    assert scores.score("good") == pytest.approx(1.0)
    scores.record("bad", WRONG_REWARD)
    assert scores.score("bad") == pytest.approx(-2.0)
    scores.record("odd", "some_new_event")  # unknown events cost the default weight
    assert scores.score("odd") == pytest.approx(-1.0)
    assert scores.score("stranger") == 0.0


def test_scores_decay_toward_zero():
    clock = FakeClock()
    scores = PeerScores(ScoreConfig(half_life_s=10), clock)
    scores.record("p", Reason.BAD_SIGNATURE)
    clock.now += 10
    assert scores.score("p") == pytest.approx(-2.5)
    clock.now += 1000
    assert abs(scores.score("p")) < 1e-9


def test_ban_expires_and_grows_on_repeat():
    clock = FakeClock()
    scores = PeerScores(ScoreConfig(ban_threshold=-10, ban_base_s=60, ban_max_s=1000), clock)
    for _ in range(3):
        scores.record("p", Reason.BAD_SIGNATURE)  # -5 each: banned on the third
    assert scores.is_banned("p") and scores.ban_remaining_s("p") == pytest.approx(60)
    scores.record("p", Reason.BAD_SIGNATURE)  # ignored while banned
    clock.now += 61
    assert not scores.is_banned("p") and scores.score("p") == 0.0
    for _ in range(3):
        scores.record("p", Reason.BAD_SIGNATURE)
    assert scores.ban_remaining_s("p") == pytest.approx(120)  # doubled
    for _ in range(5):
        clock.now += 2000
        for _ in range(3):
            scores.record("p", Reason.BAD_SIGNATURE)
    assert scores.ban_remaining_s("p") == pytest.approx(1000)  # capped
    info = {i.peer_id: i for i in scores.snapshot()}["p"]
    assert info.banned and info.ban_count == 7 and info.rejected == 22


def test_bounded_memory_never_evicts_a_ban_for_fresh_identities():
    clock = FakeClock()
    scores = PeerScores(ScoreConfig(max_peers=50), clock)
    for _ in range(3):
        scores.record("villain", Reason.BAD_SIGNATURE)
    for i in range(10_000):
        scores.record(f"sybil-{i}", ACCEPTED)
    assert len(scores) == 50
    assert scores.is_banned("villain")
