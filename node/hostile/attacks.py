"""What each hostile kind sends, one function per kind: `ATTACKS[kind](peer, round_index, budget)`
publishes at most `budget` messages through `peer` (a node/hostile/peer.py HostilePeer, which
documents the kinds and what a receiver records for each) and returns how many it sent. They
build on the peer's blocks (tasks, well-formed groups, junk text, its outboxes) and what it
learned from traffic (honest keys, envelopes and groups)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from node.train.hints import leaks_answer
from node.tasks.base import Task
from node.scoring.verifiers import ANSWER_CLOSE, ANSWER_OPEN
from node.peers.wire import wire_task_ref
from proto import swarm_pb2
from protocol import Kind, peer_id_from_public_key
from protocol.testing import forge, raw_envelope, tamper_body, with_fields

if TYPE_CHECKING:
    from node.hostile.peer import HostilePeer

FLOOD_DISTINCT_GROUPS = 8  # flood: distinct groups built a step (each re-sealed many times)
MAX_OVERSIZED_PER_STEP = 4  # 4 MiB each; a receiver's byte bucket (16 MiB) admits ~3 anyway
HINT_LEVELS = (swarm_pb2.Hint.L1, swarm_pb2.Hint.L2, swarm_pb2.Hint.L3, swarm_pb2.Hint.PREFIX)


# -- INVALID: an honest node must never train on them or keep them as hints -------------------
def forged(peer: HostilePeer, round_index: int, budget: int) -> int:
    tasks = peer.tasks(budget)
    for i, task in enumerate(tasks):
        if peer.keys_heard:
            claimed = peer.rng.choice(list(peer.keys_heard))
            peer.claimed[peer_id_from_public_key(claimed)] = None
        else:  # nobody heard yet: claim some other key (the signature fails all the same)
            claimed = peer.fresh_identity().public_key_bytes
            peer.counters["forged_unknown_claim"] += 1
        if i % 4 == 3:
            text = _junk_hint_text(peer, task) or "0"
            hint = swarm_pb2.Hint(task_ref=wire_task_ref(task.ref), level=swarm_pb2.Hint.PREFIX, text=text)
            peer.hint_texts.append(text)
            peer.publish("hints", forge(peer.raw_outbox.seal(hint), claimed, peer.identity), "forged_hint")
        else:
            raw = peer.raw_outbox.seal(peer.group(task, round_index))
            peer.publish("rollouts", forge(raw, claimed, peer.identity), "forged_group")
    return len(tasks)


def tampered(peer: HostilePeer, round_index: int, budget: int) -> int:
    tasks = peer.tasks(budget)
    for i, task in enumerate(tasks):
        raw = peer.raw_outbox.seal(peer.group(task, round_index))
        envelope = swarm_pb2.Envelope.FromString(raw)
        if i % 3 == 0:
            data, what = tamper_body(raw), "tampered_body"
        elif i % 3 == 1:
            data, what = with_fields(raw, timestamp_ms=envelope.timestamp_ms + 1), "tampered_timestamp"
        else:
            data, what = with_fields(raw, sequence=envelope.sequence + 1), "tampered_sequence"
        peer.publish("rollouts", data, what)
    return len(tasks)


def liar(peer: HostilePeer, round_index: int, budget: int) -> int:
    tasks = peer.tasks(budget)
    for task in tasks:
        group = peer.group(task, round_index)  # verifier_digest = ours: the receiver can check
        lies = peer.rng.sample(range(len(group.completions)), peer.rng.randint(1, len(group.completions)))
        for i in lies:
            completion = group.completions[i]
            completion.claimed_reward = 0.0 if completion.claimed_reward >= 0.5 else 1.0
        peer.publish("rollouts", peer.valid_outbox.seal(group), "lying_group")
    return len(tasks)


def replay(peer: HostilePeer, round_index: int, budget: int) -> int:
    captured = list(peer.captured)
    chosen = peer.rng.sample(captured, min(budget, len(captured)))
    for topic, data in chosen:
        kind = next(k for k, t in peer.topics.items() if t == topic)
        peer.publish(kind, data, f"replayed_{kind}")
    return len(chosen)


def malformed(peer: HostilePeer, round_index: int, budget: int) -> int:
    tasks = peer.tasks(budget)
    topic_kinds = list(peer.topics)
    for i, task in enumerate(tasks):
        topic_kind = topic_kinds[i % len(topic_kinds)]
        style = i % 4
        if style == 0:  # a first byte with wire type 7 never parses
            data, what = b"\x07" + peer.rng.randbytes(peer.rng.randrange(16, 512)), "random_bytes"
        else:
            raw = peer.raw_outbox.seal(peer.group(task, round_index))
            envelope = swarm_pb2.Envelope.FromString(raw)
            if style == 1:  # the signature is the last field: cut into it
                data, what = raw[: len(raw) - peer.rng.randint(1, 66)], "truncated_envelope"
            elif style == 2:
                data, what = with_fields(raw, sender_public_key=envelope.sender_public_key[:31]), "short_key"
            else:
                data, what = with_fields(raw, signature=envelope.signature[:63]), "short_signature"
        peer.publish(topic_kind, data, what)
    return len(tasks)


def oversized(peer: HostilePeer, round_index: int, budget: int) -> int:
    n = min(budget, MAX_OVERSIZED_PER_STEP)
    for _ in range(n):
        body = peer.rng.randbytes(peer.limits.max_message_bytes + 1 + peer.rng.randrange(4096))
        data = raw_envelope(peer.identity, int(Kind.ROLLOUT_GROUP), body, peer.raw_outbox.sequencer.next(),
                            int(peer.clock() * 1000))
        peer.publish("rollouts", data, "oversized")
    return n


def hint_leak(peer: HostilePeer, round_index: int, budget: int) -> int:
    sent = 0
    for task in peer.targets(budget):
        answer = (task.reference_answer or "").strip()
        if not answer:
            continue
        text = peer.rng.choice([answer, f"The answer is {answer}.", f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}",
                                f"so it is {answer}"])[: peer.limits.max_hint_chars]
        if not leaks_answer(text, task.reference_answer):
            continue
        _send_hint(peer, task, peer.rng.choice(HINT_LEVELS), text, "leaking_hint")
        sent += 1
    return sent


# -- VALID-but-hostile: they pass every check and may be used, but must not hurt -----------------
def flood(peer: HostilePeer, round_index: int, budget: int) -> int:
    # Scoring a group costs far more than signing one: a few distinct groups a step, each
    # sealed again and again (every copy a new sequence number, so a new valid message).
    tasks = peer.tasks(min(budget, FLOOD_DISTINCT_GROUPS))
    if not tasks:
        return 0
    groups = [peer.group(task, round_index) for task in tasks]
    for i in range(budget):
        peer.publish("rollouts", peer.valid_outbox.seal(groups[i % len(groups)]), "flood_group")
    return budget


def sybil(peer: HostilePeer, round_index: int, budget: int) -> int:
    for _ in range(budget):
        outbox = peer.sybil_outbox()
        if peer.groups_heard and peer.rng.random() < 0.5:  # an honest group, re-signed as its own
            group, what = peer.rng.choice(list(peer.groups_heard)), "sybil_resigned_group"
        else:
            group, what = peer.group(peer.tasks(1)[0], round_index), "sybil_group"
        peer.publish("rollouts", outbox.seal(group), what)
    return budget


def hint_junk(peer: HostilePeer, round_index: int, budget: int) -> int:
    sent = 0
    for task in peer.targets(budget, only_wanted=True):
        text = _junk_hint_text(peer, task)
        if text is None:
            continue
        level = swarm_pb2.Hint.PREFIX if peer.rng.random() < 0.5 else peer.rng.choice(HINT_LEVELS[:3])
        _send_hint(peer, task, level, text, "junk_hint")
        sent += 1
    return sent


def garbage(peer: HostilePeer, round_index: int, budget: int) -> int:
    tasks = peer.tasks(budget)
    for task in tasks:
        peer.publish("rollouts", peer.valid_outbox.seal(peer.group(task, round_index, correct=False)),
                     "garbage_group")
    return len(tasks)


ATTACKS: dict[str, Callable[[HostilePeer, int, int], int]] = {
    "forged": forged, "tampered": tampered, "liar": liar, "replay": replay, "flood": flood,
    "malformed": malformed, "oversized": oversized, "sybil": sybil, "hint_leak": hint_leak,
    "hint_junk": hint_junk, "garbage": garbage,
}


# -- shared by the hint kinds ------------------------------------------------------------------
def _junk_hint_text(peer: HostilePeer, task: Task) -> str | None:
    """Junk of the task's family that never contains its answer (None after 20 tries)."""
    for _ in range(20):
        text = peer.junk(task)[: peer.limits.max_hint_chars]
        if text.strip() and not leaks_answer(text, task.reference_answer):
            return text
    return None


def _send_hint(peer: HostilePeer, task: Task, level: int, text: str, what: str) -> None:
    hint = swarm_pb2.Hint(task_ref=wire_task_ref(task.ref), level=level, text=text)
    peer.hint_texts.append(text)
    peer.publish("hints", peer.valid_outbox.seal(hint), what)
