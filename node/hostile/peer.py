"""Hostile peers for the testnet: every kind of bad traffic an honest node must survive.

A `HostilePeer` joins a swarm's three topics (rollouts, hints, hint-requests) over any
`protocol.Transport` (the in-process `MemoryBus` in tests, libp2p as its own process through
`python -m node.hostile.process`). Each `step()` first drains what arrived, to learn from it
(honest signing keys, honest envelopes to replay, honest groups to re-sign, tasks peers asked hints
for or failed), then publishes at most `per_step` messages of its kind (`flood`: `per_step * 20`).

Kinds, and what an honest receiver records in `status()["rejected_by_reason"]`:

INVALID: an honest node must never train on them or keep them as hints.
  forged     groups (every 4th message a prefix hint) whose envelope claims an honest node's public
             key learned from traffic (any fresh key until one is heard), signed by the attacker's
             own key: `bad_signature`, charged to the transport peer, never to the claimed key;
             then `banned`.
  tampered   groups validly signed by its own key, then a body bit, the timestamp or the sequence
             changed: `bad_signature`, then `banned`.
  liar       well-formed groups for real tasks, some claimed rewards flipped, `verifier_digest` =
             the honest nodes' `Verifier.digest` (so the lie is provable): `wrong_reward` (-2 to
             the signer), then `banned`.
  replay     honest envelopes drained from the three topics, re-published byte for byte: `replay`
             (charged to nobody: neither the signer nor a relay is proven at fault); a node's own message replayed
             back to it is `own_message`; old copies would be `stale` / `expired`.
  malformed  random bytes, truncated envelopes, 31-byte keys, 63-byte signatures: `malformed`,
             then `banned`.
  oversized  signed envelopes over `Limits.max_message_bytes` (at most 4 a step, about 1 MiB each):
             `oversized`, then `banned` / `rate_limited`. Over libp2p the receiving transport drops
             them before the Ingress (`dropped_inbound_oversize`), and the process entry point
             raises its own transport's limit so that they do leave it.
  hint_leak  hints (any level) whose text contains the task's reference answer, for tasks peers
             asked about, else fresh ones: `hint_leaks_answer` (-2 to the signer), then `banned`.

VALID-but-hostile: they pass every check and may be used, but must not hurt.
  flood      `per_step * 20` valid, honestly scored groups a step from ONE key (8 distinct ones,
             each sealed again under new sequence numbers): `rate_limited` past
             the burst (dropped, no blame), `flooding` past 4x the limit (-0.5 each, then `banned`),
             and `observed: pool_sender_cap`.
  sybil      valid groups, each from the next of `sybil_keys` fresh keys: captured honest groups
             re-signed as its own (`duplicate_content` once the original was pooled or used), or
             its own honestly scored ones; young keys, they share a capped part of the mix
             (node/peers/admission.py). Over libp2p every key shares the process's host id, so one
             rate bucket.
  hint_junk  well-formed hints (prefix, or l1-l3) with junk text that never contains the answer, for
             tasks it saw requested (HintRequests) or failed (groups whose claims are all 0); a
             receiver that asked keeps them (`hints_accepted`).
  garbage    groups of random text drawn from the task family's alphabet and typical answers,
             scored honestly with the same verifier (claims match): worthless, mostly zero-variance
             (`external_zero_variance`).

`EXPECTED_REASONS` lists the reasons a receiver must show for each kind, `POSSIBLE_REASONS` every
reason its traffic may cause (a harness can flag anything else). Groups a hostile peer builds
itself carry `ModelCard.tokenizer_fingerprint = "hostile-<kind>"` (`marker(kind)`), which a receiver
keeps as `ScoredGroup.meta["tokenizer"]`; `identities()` names every key it signed with.

Tasks come from `source` (configured like the honest nodes), so honest receivers can rebuild every
ref. The peer never trains and loads no model: its completions are text only (no token ids or
log-probs, so a receiver gives them behavior tier 2).

Modules: this one is the peer's shell (what it learns from traffic, its building blocks, how it
publishes); what each kind sends is node/hostile/attacks.py, one function per kind. As its
own process over libp2p: `python -m node.hostile.process` (node/hostile/process.py).
"""
from __future__ import annotations

import logging
import random
import time
from collections import Counter, OrderedDict, deque
from typing import Callable

from node.peers.wire import local_task_ref, to_wire
from node.train.groups import ScoredGroup
from node.tasks.base import Task, TaskSource
from node.hostile.attacks import ATTACKS
from node.scoring.verifiers import ANSWER_CLOSE, ANSWER_OPEN, Verifier
from policy.types import Rollout
from proto import swarm_pb2
from protocol import Kind, Limits, NodeIdentity, Outbox, Sequencer, Transport, topic_name
from protocol.envelope import decode_envelope, verify_envelope
from protocol.errors import Rejected
from protocol.limits import validate_rollout_group

log = logging.getLogger(__name__)

INVALID_KINDS = ("forged", "tampered", "liar", "replay", "malformed", "oversized", "hint_leak")
VALID_KINDS = ("flood", "sybil", "hint_junk", "garbage")
KINDS = ("forged", "tampered", "liar", "replay", "flood", "malformed", "oversized", "sybil", "hint_leak",
         "hint_junk", "garbage")
assert set(KINDS) == set(INVALID_KINDS) | set(VALID_KINDS) == set(ATTACKS)

# Reasons a receiver must record (status()["rejected_by_reason"]) once a kind's messages arrive.
EXPECTED_REASONS: dict[str, tuple[str, ...]] = {
    "forged": ("bad_signature",),
    "tampered": ("bad_signature",),
    "liar": ("wrong_reward",),
    "replay": ("replay",),
    "malformed": ("malformed",),
    "oversized": ("oversized",),
    "hint_leak": ("hint_leaks_answer",),
    "flood": ("rate_limited",),  # once it has sent more than the 200-message burst
    "sybil": (),
    "hint_junk": (),
    "garbage": (),
}
# Every reason a kind's traffic may cause on a receiver (a ban follows repeated offences; a replay of
# the receiver's own message is `own_message`; old copies are `stale` / `expired`; text a tiny
# vocabulary cannot encode is `untokenizable`). Any kind may meet `duplicate_content`: two groups
# with the same prompt and completions, from honest peers too (one-character answers collide).
_ANY = frozenset({"duplicate_content"})
POSSIBLE_REASONS: dict[str, frozenset[str]] = {kind: reasons | _ANY for kind, reasons in {
    "forged": frozenset({"bad_signature", "banned"}),
    "tampered": frozenset({"bad_signature", "banned"}),
    "liar": frozenset({"wrong_reward", "banned"}),
    "replay": frozenset({"replay", "stale", "expired", "own_message", "banned"}),
    "malformed": frozenset({"malformed", "banned"}),
    "oversized": frozenset({"oversized", "rate_limited", "flooding", "banned"}),
    "hint_leak": frozenset({"hint_leaks_answer", "banned"}),
    "flood": frozenset({"rate_limited", "flooding", "banned"}),  # -0.5 per flooding: a sustained flood gets banned
    "sybil": frozenset(),
    "hint_junk": frozenset({"untokenizable", "too_long"}),
    "garbage": frozenset({"untokenizable", "too_long"}),
}.items()}

FLOOD_FACTOR = 20          # flood: messages per step = per_step * FLOOD_FACTOR
GROUP_SIZE = 8             # completions per group it builds
MAX_CAPTURED = 512         # honest envelopes kept for replay
MAX_GROUPS = 256           # honest group bodies kept for sybil re-signing
MAX_KEYS = 1024            # honest public keys kept for forging
MAX_WANTED = 256           # tasks seen requested or failed (hint targets)
MAX_EXAMINED = 4096        # drained messages examined per topic and step (the rest are dropped)
MAX_TEXT = 64              # characters of one junk string
TOPIC_KINDS = ("rollouts", "hints", "hint-requests")


def marker(kind: str) -> str:
    """The tokenizer fingerprint on every ModelCard a hostile peer of `kind` builds."""
    return f"hostile-{kind}"


def is_valid_kind(kind: str) -> bool:
    """True for kinds whose messages pass every check (flood, sybil, hint_junk, garbage)."""
    if kind not in KINDS:
        raise ValueError(f"unknown hostile kind {kind!r}; valid: {', '.join(KINDS)}")
    return kind in VALID_KINDS


class HostilePeer:
    """One adversarial peer of one `kind` (see the module docstring) on `transport`.

    identity: its main key (signs everything but sybil messages; in the process entry point it is
    also the libp2p host key, so the transport peer id equals identities()[0]); if None, one derived
    from `seed` and `kind`, as are its sybil keys (runs repeat).
    """

    def __init__(self, kind: str, transport: Transport, swarm: str, source: TaskSource, verifier: Verifier, *,
                 seed: int = 0, per_step: int = 8, sybil_keys: int = 50, limits: Limits = Limits(),
                 identity: NodeIdentity | None = None, clock: Callable[[], float] = time.time) -> None:
        is_valid_kind(kind)
        if per_step < 0 or sybil_keys < 1:
            raise ValueError("need per_step >= 0 and sybil_keys >= 1")
        self.kind = kind
        self.transport = transport
        self.swarm = swarm
        self.source = source
        self.verifier = verifier
        self.seed = seed
        self.per_step = per_step
        self.sybil_keys = sybil_keys
        self.limits = limits
        self.rng = random.Random(f"hostile/{kind}/{seed}")
        self._key_rng = random.Random(f"hostile-keys/{kind}/{seed}")  # its own stream: keys never shift the rest
        self.identity = identity or self.fresh_identity()
        # Raw outbox (no outbound validation) for what must break limits; a validating one for
        # messages that are meant to pass every check (a bug here should raise, not pass silently).
        # One key, one sequence: both share the sequencer.
        self.clock = clock  # what its messages are stamped with (a virtual-time testnet's clock)
        sequencer = Sequencer(clock=clock)
        self.raw_outbox = Outbox(self.identity, limits=None, clock=clock, sequencer=sequencer)
        self.valid_outbox = Outbox(self.identity, limits=limits, clock=clock, sequencer=sequencer)
        self._sybils: list[Outbox] = []
        self._sybil_next = 0
        self.topics = {k: topic_name(swarm, k) for k in TOPIC_KINDS}
        for topic in self.topics.values():
            transport.subscribe(topic)
        self.model_card = swarm_pb2.ModelCard(name=marker(kind), tokenizer_fingerprint=marker(kind))
        self.sampling = swarm_pb2.SamplingParams(temperature=1.0, max_new_tokens=0)
        self.counters: Counter[str] = Counter()  # what it sent
        self.learned: Counter[str] = Counter()   # what it drained and learned from
        self.hint_texts: deque[str] = deque(maxlen=1024)  # texts of the hints it sent (newest last)
        self._used: dict[str, None] = {self.identity.peer_id(): None}  # signing keys, insertion order
        self._own_keys: set[bytes] = {self.identity.public_key_bytes}
        # learned from traffic (for forging, replaying and re-signing: node/hostile/attacks.py)
        self.keys_heard: OrderedDict[bytes, None] = OrderedDict()  # honest public keys seen
        self.claimed: dict[str, None] = {}  # peer ids of the honest keys its forgeries claimed
        self.captured: deque[tuple[str, bytes]] = deque(maxlen=MAX_CAPTURED)  # (topic, honest envelope)
        self.groups_heard: deque[swarm_pb2.RolloutGroup] = deque(maxlen=MAX_GROUPS)
        self._wanted: OrderedDict[str, Task] = OrderedDict()  # tasks requested or failed, by ref key
        self._alphabet: dict[str, set[str]] = {}   # family (source/dataset/digest) -> characters
        self._typical: dict[str, deque[str]] = {}  # family -> reference answers seen
        self._task_round = 10**9 + (seed % 10**6) * 1000  # its own task stream, apart from the nodes'
        for task in source.batch(0, 32):  # learn the task families' alphabets and typical answers
            self._note(task)

    # -- public ------------------------------------------------------------------------------
    @property
    def valid(self) -> bool:
        return self.kind in VALID_KINDS

    def step(self, round_index: int) -> int:
        """Drain what arrived, then publish at most this step's budget; returns messages sent."""
        self._drain()
        budget = self.per_step * FLOOD_FACTOR if self.kind == "flood" else self.per_step
        sent = ATTACKS[self.kind](self, round_index, budget) if budget else 0
        self.learned["steps"] += 1
        return sent

    def identities(self) -> list[str]:
        """Peer ids of every key it signed with (its main key first, then the sybil keys used)."""
        return list(self._used)

    def claimed_identities(self) -> list[str]:
        """Peer ids of honest keys its forged envelopes claimed (never signed by it)."""
        return list(self.claimed)

    # -- learning from traffic ---------------------------------------------------------------
    def _drain(self) -> None:
        for topic_kind, topic in self.topics.items():
            items = self.transport.drain(topic)
            self.learned["drained"] += len(items)
            self.learned["skipped"] += max(0, len(items) - MAX_EXAMINED)
            for item in items[:MAX_EXAMINED]:
                try:
                    self._learn(topic_kind, topic, bytes(item.data))
                except Exception:  # hostile traffic from others must not stop this peer either
                    log.debug("could not learn from a message on %s", topic, exc_info=True)
                    self.learned["unreadable"] += 1

    def _learn(self, topic_kind: str, topic: str, data: bytes) -> None:
        try:
            envelope = decode_envelope(data, self.limits)
            verify_envelope(envelope)
        except Rejected:
            self.learned["unauthentic"] += 1
            return
        key = bytes(envelope.sender_public_key)
        if key in self._own_keys:
            return
        self.learned["authentic"] += 1
        self.keys_heard[key] = None
        self.keys_heard.move_to_end(key)
        while len(self.keys_heard) > MAX_KEYS:
            self.keys_heard.popitem(last=False)
        self.captured.append((topic, data))
        kind = envelope.kind
        if kind == Kind.ROLLOUT_GROUP:
            body = swarm_pb2.RolloutGroup.FromString(envelope.body)
            validate_rollout_group(body, self.limits)
            if body.hint_text:
                return
            self.groups_heard.append(body)
            if max(c.claimed_reward for c in body.completions) <= 0.0:  # its sender failed the task
                self._want(body.task_ref, "failed")
        elif kind == Kind.HINT_REQUEST:
            self._want(swarm_pb2.HintRequest.FromString(envelope.body).task_ref, "requested")

    def _want(self, ref: swarm_pb2.TaskRef, why: str) -> None:
        try:
            task = self.source.rebuild(local_task_ref(ref))
        except (ValueError, TypeError):
            return
        self._note(task)
        self._wanted[task.ref.key] = task
        self._wanted.move_to_end(task.ref.key)
        while len(self._wanted) > MAX_WANTED:
            self._wanted.popitem(last=False)
        self.learned[why] += 1

    def _note(self, task: Task) -> None:
        family = self._family(task)
        letters = self._alphabet.setdefault(family, set())
        if len(letters) < 256:
            letters.update(task.question[:512])
            letters.update(task.reference_answer or "")
        answer = (task.reference_answer or "").strip()
        if answer and len(answer) <= MAX_TEXT:
            self._typical.setdefault(family, deque(maxlen=64)).append(answer)

    @staticmethod
    def _family(task: Task) -> str:
        return f"{task.ref.source}/{task.ref.dataset}/{task.ref.config_digest}"

    # -- building blocks (the kinds in node/hostile/attacks.py use them) ---------------
    def tasks(self, n: int) -> list[Task]:
        """`n` fresh tasks from its own stream (apart from the honest nodes')."""
        tasks = self.source.batch(self._task_round, n)
        self._task_round += 1
        for task in tasks:
            self._note(task)
        return tasks

    def targets(self, n: int, only_wanted: bool = False) -> list[Task]:
        """Tasks peers asked hints for or failed, newest first; then fresh draws (unless only_wanted)."""
        wanted = list(reversed(self._wanted.values()))[:n]
        if only_wanted or len(wanted) >= n:
            return wanted
        return wanted + self.tasks(n - len(wanted))

    def _answer_text(self, task: Task) -> str | None:
        """A completion that our verifier scores as correct (None when the task has no answer)."""
        answer = task.reference_answer
        if answer is None or not answer.strip():
            return None
        return answer if self.verifier.fmt == "raw" else f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"

    def junk(self, task: Task) -> str:
        """Random text of the task's family: a typical (other) answer or random characters."""
        family = self._family(task)
        answer = (task.reference_answer or "").strip()
        others = [a for a in self._typical.get(family, ()) if a != answer]
        if others and self.rng.random() < 0.25:
            return self.rng.choice(others)
        letters = sorted(self._alphabet.get(family) or set("0123456789"))
        # no longer than the answer: an honest node's wrong answers fit its own length limit, which
        # receivers enforce on peers (swarm.max_external_tokens; one token in the tiny preset)
        length = self.rng.randint(1, min(MAX_TEXT, max(1, len(answer))))
        return "".join(self.rng.choice(letters) for _ in range(length))

    def _junk_completion(self, task: Task) -> str:
        text = self.junk(task)
        return text if self.verifier.fmt == "raw" else f"{ANSWER_OPEN}{text}{ANSWER_CLOSE}"

    def group(self, task: Task, round_index: int, *, correct: bool = True) -> swarm_pb2.RolloutGroup:
        """A well-formed group for `task`, every claimed reward computed with our verifier; with
        `correct`, 1 to G-1 completions are the reference answer (reward variance)."""
        right = self._answer_text(task) if correct else None
        k = self.rng.randint(1, GROUP_SIZE - 1) if right is not None else 0
        texts = [right] * k + [self._junk_completion(task) for _ in range(GROUP_SIZE - k)]
        self.rng.shuffle(texts)
        rewards, flags = [], []
        for text in texts:
            reward, info = self.verifier.score(task, self.source, text)
            rewards.append(float(reward))
            flags.append(bool(info["correct"]))
        rollouts = [Rollout(prompt_ids=[], completion_ids=[], logprobs=None, text=t, offsets=[], truncated=False)
                    for t in texts]
        group = ScoredGroup(task=task, rollouts=rollouts, rewards=rewards, correct=flags)
        return to_wire(group, round_index, self.model_card, self.sampling, self.verifier.digest)

    def publish(self, topic_kind: str, data: bytes, what: str) -> None:
        """Sends `data` on one of its three topics, counted under `what`."""
        self.transport.publish(self.topics[topic_kind], data)
        self.counters["messages"] += 1
        self.counters["bytes"] += len(data)
        self.counters[what] += 1

    def fresh_identity(self) -> NodeIdentity:
        """A new key from the peer's seed: a memory testnet's hostile peers repeat from run to run."""
        return NodeIdentity.from_seed(self._key_rng.randbytes(32))

    def sybil_outbox(self) -> Outbox:
        """The next of its `sybil_keys` keys (made on first use, then reused in turn)."""
        index = self._sybil_next % self.sybil_keys
        self._sybil_next += 1
        if index == len(self._sybils):
            identity = self.fresh_identity()
            self._sybils.append(Outbox(identity, limits=self.limits, clock=self.clock))
            self._own_keys.add(identity.public_key_bytes)
        outbox = self._sybils[index]
        self._used[outbox.identity.peer_id()] = None
        return outbox
