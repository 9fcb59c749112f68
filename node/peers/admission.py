"""Which verified peer groups may enter the external mix: content dedup across signers, and the
weight new keys earn. Identities are free (anyone can make 100 keys), so neither rule trusts a key.

Duplicates: a group's content digest covers its prompt and its completion texts (order and runs
of whitespace ignored), not the signer. A group whose content is already in the pool, or was
credited within the last `dedup_rounds` rounds, is refused as `duplicate_content`: one honest
group re-signed by 100 keys is trained (or credited) at most once. Neither signer is blamed (two
honest peers can produce the same group of short answers). Only credited groups are remembered, so
the memory grows with this node's own rounds (at most J + I groups a round), never with what
peers send.

Young keys: a key is young until both `young_groups` of its verified, valid, non-duplicate groups
were credited and its first such group arrived `young_rounds` rounds ago. A group is credited when
this node trains on it, or, for a young key, when one of the young slots picks it although it has
no reward variance (verified, but nothing to train: an honest peer that has solved its tasks
sends mostly such groups, and would otherwise stay young forever). Young keys together hold at
most `young_share_max` of the external mix (with J = 4: one young group beside three established
ones, and fewer when established keys offer fewer; a fraction carries over), and in a round with
no established group at most that share of the J slots (0.25 of J = 2 is one slot every other
round) while no established key was heard from lately (`split`), trained or credited alike.

Diversity, not seniority. Keys are free, addresses are not: every key is placed in the *network
group* of the host that delivered its groups (protocol/netgroups.py: the /16 of an IPv4 address, the
/32 of an IPv6 one, the relay of a peer reached only through one; "" while unknown, and for every
key of the in-process testnet). The young slots go in turns: the key whose turn it is keeps it while it
earns its `young_groups` credits and has groups pooled (for `young_groups` turns at most: one
that is picked but not credited does not keep it), then the turn passes to the network group
served longest ago, and within it to the key served longest ago (`young_order`, `took_turn`):
whoever arrived first, 200 keys from one group share that group's turns and an honest newcomer
from another group gets its own. A turn held to the end establishes keys one after another (a new swarm's first peer in
`young_groups` rounds, as first-come did) instead of spreading credits thin over all of them. Failing keys are benched by the pool
(node/peers/bench.py).

Windows in time (with a `clock`: `swarm-node join`'s background ingest). Rounds alone mean nothing
to an attacker: at 50 rounds/s, 20 rounds are 0.4 s and 32 flooding keys were established within
30 s, holding 0.92 of a node's mix. So with a clock, a key that has earned its credits and rounds is
also kept young until `young_seconds` after its first group, and it is then *promoted* at the start
of a round: at most one key per network group per `establish_interval_s`, at most
`max_promotions_per_interval` keys across all groups in any such interval, and never more than
`max_established_per_group` established keys in one group. 64 honest hosts in 64 groups are all
established a few intervals after `young_seconds`; 400 keys from one group get one promotion per
interval and at most their group's cap, and a newcomer elsewhere never queues behind them.
The bootstrap window: while no key is established at all (a node that just joined a new swarm),
a key the operator named (`--peers`, `swarm.relays`: `trusted`) that has earned its credits and
rounds is promoted at once; any other key waits `bootstrap_young_fraction` of `young_seconds`, so a
Sybil seen a second before the operator's peer does not take the first promotion. Establishment is
kept only while useful: a key with nothing credited for `establish_decay_s` seconds is young again
and earns its place anew.
The dedup memory likewise keeps a credited digest for `dedup_rounds` rounds AND
`dedup_seconds` seconds (1000 rounds were 20 s at a fast node: one group re-signed by 100 keys
was trained twice), at most `MAX_REMEMBERED` digests (the oldest forgotten first). Without a clock
(the in-process testnet, which runs in virtual time and must stay deterministic) every window is
in rounds only and a key is established the moment it has earned its credits and rounds.

Key table: at most `max_keys` records. When full, the record worth least goes: young before
established, fewest credits, longest inactive, nothing pooled, newest arrival, in that order. A
flood of fresh keys forgets itself; an active newcomer that has earned credit is never forgotten
for it.

Restarts: `state_dict` / `load_state_dict` carry key records, credits and the dedup memory across a
checkpoint (node/train/loop.py saves them with the model), so a restart neither makes every key young
again nor forgets what was trained.
"""
from __future__ import annotations

import hashlib
import math
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from node.train.groups import ScoredGroup

if TYPE_CHECKING:
    from node.peers.verify import Candidate
from node.peers.reasons import DUPLICATE  # the refusal admission decides (node/peers/pool.py counts it)

MAX_KEYS = 4096  # key records kept; beyond it the record worth least is forgotten (see _make_room)
MAX_REMEMBERED = 200_000  # credited digests kept at most (the oldest go first): ~30 MB
STATE_VERSION = 3  # 1: no times (read: its keys that earned their credits and rounds are established); 2: no groups


@dataclass
class KeyRecord:
    first_seen: int   # round of its first admitted group
    arrival: int      # admission order, to break ties within a round
    credited: int = 0  # its verified, non-duplicate groups trained on or credited without variance
    pooled: int = 0   # its groups in the pool now
    last_active: int = 0  # round of its latest admitted group
    first_seen_s: float = 0.0  # clock time of its first admitted group (with a clock)
    established_at: float = 0.0  # clock time it was promoted (0: not yet; with a clock)
    group: str = ""  # network group of the host that delivered it ("" unknown; `place`)
    last_credited_s: float = 0.0  # clock time of its latest credit (establishment decays without one)


def content_digest(group: ScoredGroup | Candidate) -> str:
    """sha256 over the prompt and the sorted, whitespace-normalised completion texts (the same for a
    peer's group before and after verification)."""
    texts = sorted(" ".join(text.split()) for text in group.texts)
    h = hashlib.sha256(group.task.prompt_key.encode())
    for text in texts:
        h.update(b"\0" + text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


class Admission:
    """The state behind both rules: digests pooled and credited, and what each key has earned."""

    def __init__(self, young_share_max: float, young_groups: int, young_rounds: int, dedup_rounds: int,
                 max_keys: int = MAX_KEYS, *, clock: Callable[[], float] | None = None, young_seconds: float = 0.0,
                 establish_interval_s: float = 0.0, dedup_seconds: float = 0.0,
                 max_promotions_per_interval: int = 16, max_established_per_group: int = 8,
                 bootstrap_young_fraction: float = 0.25, establish_decay_s: float = 0.0,
                 trusted: frozenset[str] = frozenset()):
        if not 0.0 <= young_share_max <= 1.0:
            raise ValueError(f"young_share_max must be in [0, 1], got {young_share_max}")
        self.young_share_max = young_share_max
        self.young_groups = young_groups
        self.young_rounds = young_rounds
        self.dedup_rounds = dedup_rounds
        self.max_keys = max_keys
        self.clock = clock  # None: every window in rounds only (module doc)
        self.young_seconds = young_seconds
        self.establish_interval_s = establish_interval_s
        self.dedup_seconds = dedup_seconds
        self.max_promotions_per_interval = max_promotions_per_interval
        self.max_established_per_group = max_established_per_group
        self.bootstrap_young_fraction = bootstrap_young_fraction
        self.establish_decay_s = establish_decay_s  # 0: established for good
        self.trusted = frozenset(trusted)  # keys the operator named: first in the bootstrap window
        self._group_promoted: dict[str, float] = {}  # network group -> time of its latest promotion
        self._turn = 0  # rotation among keys of one group for promotions (_in_turn)
        self._calls = 0  # young turns taken (took_turn)
        self._served: dict[str, int] = {}  # key -> the young turn it was last served in
        self._group_served: dict[str, int] = {}  # network group -> the young turn one of its keys last was
        self._holder: str | None = None  # the young key whose turn it is until it has its credits
        self._held = 0  # turns it has held in a row: at most young_groups
        self._established_heard = (-(10**18), float("-inf"))  # (round, time) an established key was last heard
        self.keys: OrderedDict[str, KeyRecord] = OrderedDict()  # in order of first appearance
        self._pooled: set[str] = set()
        self._credited: OrderedDict[str, tuple[int, float]] = OrderedDict()  # digest -> (round, time) credited
        self._round = 0
        self._arrivals = 0
        self._slot_credit = 0.0  # young slots earned and not yet spent
        self.any_established = False  # some key established, as of the last start_round

    @classmethod
    def from_config(cls, cfg, clock: Callable[[], float] | None = None, trusted: frozenset[str] = frozenset()) -> Admission:
        """From the config's `swarm.admission` section (its keys are this constructor's parameters);
        with `clock` (wall seconds) the windows in time apply too; `trusted`: the keys the operator
        named (--peers, swarm.relays)."""
        return cls(**cfg.model_dump(), clock=clock, trusted=trusted)

    def _now(self) -> float:
        return 0.0 if self.clock is None else self.clock()

    digest = staticmethod(content_digest)

    def admit(self, origin: str, digest: str, round_index: int) -> bool:
        """False for content already pooled or credited; else records the group as pooled."""
        if digest in self._pooled or digest in self._credited:
            return False
        record = self.keys.get(origin)
        if record is None:
            self._make_room()
            record = self.keys[origin] = KeyRecord(first_seen=round_index, arrival=self._arrivals,
                                                   first_seen_s=self._now())
            self._arrivals += 1
        record.pooled += 1
        record.last_active = max(record.last_active, round_index)
        self._pooled.add(digest)
        return True

    def place(self, origin: str, group: str) -> None:
        """`origin`'s network group, from the host that delivered its group; the first known one
        sticks (a key cannot move to an emptier group by relaying through another host later)."""
        record = self.keys.get(origin)
        if record is not None and group and not record.group:
            record.group = group

    def unpooled(self, origin: str, digest: str) -> None:
        self._pooled.discard(digest)
        record = self.keys.get(origin)
        if record is not None:
            record.pooled = max(0, record.pooled - 1)  # a record re-made after being forgotten counts fewer

    def credit(self, origin: str, digest: str) -> None:
        """A group of `origin` was trained on, or credited as verified without variance: it earns
        the key weight and its content is remembered."""
        record = self.keys.get(origin)
        if record is not None:
            record.credited += 1
            record.last_credited_s = self._now()
        if digest:
            self._credited[digest] = (self._round, self._now())
            self._credited.move_to_end(digest)
            if len(self._credited) > MAX_REMEMBERED:
                self._credited.popitem(last=False)

    def start_round(self, round_index: int) -> None:
        """Forgets digests past both memory windows, promotes at most one key (with a clock), and
        notes whether any key is established. Once a round: O(keys)."""
        self._round = round_index
        now = self._now()
        while self._credited:
            credited_round, credited_at = next(iter(self._credited.values()))
            if round_index - credited_round <= self.dedup_rounds or (
                    self.clock is not None and now - credited_at <= self.dedup_seconds):
                break
            self._credited.popitem(last=False)
        if self.clock is not None:
            self._decay(now)
            self._promote(now)
        self.any_established = any(not self.is_young(key) for key in self.keys)

    def _earned(self, record: KeyRecord) -> bool:
        return record.credited >= self.young_groups and self._round - record.first_seen >= self.young_rounds

    def _promote(self, now: float) -> None:
        """Promotions of keys that earned their credits, rounds and `young_seconds` (module doc): in
        the bootstrap window one, a trusted key first; after it, one per network group per
        `establish_interval_s` (the group longest without one first), within the global ceiling and
        each group's cap."""
        earned = [(key, r) for key, r in self.keys.items() if not r.established_at and self._earned(r)]
        if not self.any_established:  # as of the last start_round: only _promote changes it
            trusted = [key for key, _ in earned if key in self.trusted]
            waited = [key for key, r in earned
                      if now - r.first_seen_s >= self.young_seconds * self.bootstrap_young_fraction]
            if trusted or waited:
                self._establish(self._in_turn(trusted or waited), now)
            return
        recent = sum(now - at < self.establish_interval_s for at in self._group_promoted.values())
        budget = self.max_promotions_per_interval - recent
        held = Counter(r.group for r in self.keys.values() if r.established_at)
        by_group: dict[str, list[str]] = defaultdict(list)
        for key, r in earned:
            if now - r.first_seen_s >= self.young_seconds:
                by_group[r.group].append(key)
        for group in sorted(by_group, key=lambda g: self._group_promoted.get(g, float("-inf"))):
            if budget <= 0:
                break
            if (now - self._group_promoted.get(group, float("-inf")) < self.establish_interval_s
                    or held[group] >= self.max_established_per_group):
                continue
            self._establish(self._in_turn(by_group[group]), now)
            budget -= 1

    def _in_turn(self, keys: list[str]) -> str:
        """One of `keys` (in first-appearance order), the rotation's turn: not always the first."""
        self._turn += 1
        return keys[self._turn % len(keys)]

    def _establish(self, key: str, now: float) -> None:
        record = self.keys[key]
        record.established_at = max(now, 1e-9)
        self._group_promoted[record.group] = now
        if len(self._group_promoted) > self.max_keys:  # bounded like the key table: the oldest go
            oldest = min(self._group_promoted, key=self._group_promoted.get)
            del self._group_promoted[oldest]

    def demote(self, origin: str, before: float = float("inf")) -> bool:
        """`origin` young again if it was established at or before `before` (the operator's
        `swarm-node peers --demote`, node/peers/operator.py): it earns its place anew. True if it was."""
        record = self.keys.get(origin)
        if record is None or self.is_young(origin) or (record.established_at and record.established_at > before):
            return False
        self._restart(record, self._now())
        return True

    def _restart(self, record: KeyRecord, now: float) -> None:
        record.established_at, record.credited = 0.0, 0
        record.first_seen, record.first_seen_s = self._round, now

    def records(self, limit: int) -> list[tuple[str, KeyRecord, bool]]:
        """Up to `limit` (key, record, established) rows: established keys first, then the young ones
        with the most credits (what `swarm-node peers` lists)."""
        rows = [(key, record, not self.is_young(key)) for key, record in self.keys.items()]
        rows.sort(key=lambda row: (not row[2], -row[1].credited, row[1].arrival))
        return rows[:limit]

    def _decay(self, now: float) -> None:
        """Established keys with nothing credited for `establish_decay_s` become young again and
        earn their place anew (the count, rounds and seconds restart)."""
        if self.establish_decay_s <= 0:
            return
        for record in self.keys.values():
            if record.established_at and now - max(record.last_credited_s, record.established_at) > self.establish_decay_s:
                self._restart(record, now)

    def is_young(self, origin: str) -> bool:
        record = self.keys.get(origin)
        if record is None or not self._earned(record):
            return True
        off = self.young_groups == 0 and self.young_rounds == 0  # the documented "no key is young"
        return self.clock is not None and not off and not record.established_at

    def established(self) -> list[tuple[str, float]]:
        """Established keys and when they were promoted (0.0 without a clock), in promotion order."""
        keys = [(key, record.established_at) for key, record in self.keys.items() if not self.is_young(key)]
        return sorted(keys, key=lambda kv: kv[1])

    def young_order(self, keys: list[str]) -> list[str]:
        """`keys` (young, with groups pooled) in the order the young slots serve them (module doc):
        the key holding the turn first, while it still earns its credits (for `young_groups` turns
        at most); then keys still short of `young_groups` credits, then the rest; within each, one
        key per network group in turn, the group served longest ago first and, within a group, the
        key served longest ago (never served: first seen first). Pure: `took_turn` records a turn."""
        holder = self._holder if (self._holder in keys and self._earning(self._holder)
                                  and self._held < max(1, self.young_groups)) else None
        ordered: list[str] = []
        for earning in (True, False):
            by_group: dict[str, list[str]] = defaultdict(list)
            for key in keys:
                if key != holder and self._earning(key) == earning:
                    record = self.keys.get(key)
                    by_group["" if record is None else record.group].append(key)
            waited = {g: sorted(ks, key=lambda k: (self._served.get(k, -1), self._arrival(k)))
                      for g, ks in by_group.items()}
            queues = sorted(waited.items(), key=lambda gk: (self._group_served.get(gk[0], -1),
                                                            self._arrival(gk[1][0])))
            for depth in range(max((len(ks) for _, ks in queues), default=0)):
                ordered += [ks[depth] for _, ks in queues if depth < len(ks)]
        return ([holder] if holder is not None else []) + ordered

    def took_turn(self, keys: list[str]) -> None:
        """The young slots served `keys` this round, in `young_order`'s order (the first holds the turn)."""
        self._calls += 1
        for key in keys:
            record = self.keys.get(key)
            self._served[key] = self._calls
            self._group_served["" if record is None else record.group] = self._calls
        first = keys[0] if keys and self._earning(keys[0]) else None
        self._held = self._held + 1 if first is not None and first == self._holder else 1
        self._holder = first
        if len(self._served) > 2 * self.max_keys:  # bounded like the key table
            self._served = {k: n for k, n in self._served.items() if k in self.keys}
            groups = {r.group for r in self.keys.values()}
            self._group_served = {g: n for g, n in self._group_served.items() if g in groups}

    def _earning(self, key: str) -> bool:
        """Still short of its credits (a key forgotten from the table counts as earning)."""
        record = self.keys.get(key)
        return record is None or record.credited < self.young_groups

    def _arrival(self, key: str) -> int:
        record = self.keys.get(key)
        return self._arrivals if record is None else record.arrival

    def split(self, k: int, young: int, established: int) -> tuple[int, int]:
        """This round's (young, established) slots out of k, given how many groups of each are
        eligible. Young keys hold at most `young_share_max` of the mix: each established group taken
        earns them share / (1 - share) of a slot. In a round with no established group they earn
        share * k slots instead, but only while no established key was heard from lately (a new
        swarm, or established peers gone: nobody to protect). At a node running 50 rounds/s beside
        an established peer sending a few groups a second, most rounds have no established group,
        and that allowance gave 32 flooding keys 0.63 of the mix. Fractions carry over, capped so
        that quiet rounds never bank a burst; established keys fill what young ones leave."""
        share = self.young_share_max
        if share >= 1.0 or (established == 0 and not self.established_heard_lately()):
            credit = self._earn(share * k)
            taken = min(young, k, math.floor(credit + 1e-9))
            self._slot_credit = credit
            return taken, min(established, k - taken)
        per_group = share / (1.0 - share)
        for taken in range(min(young, k), -1, -1):  # the most young slots that the rest would earn
            credit = self._earn(per_group * min(established, k - taken))
            if taken <= math.floor(credit + 1e-9):
                self._slot_credit = credit
                return taken, min(established, k - taken)
        raise AssertionError("unreachable: no young slot is always earned")

    def heard(self, origin: str) -> None:
        """A verified group of `origin` arrived (pooled or not, flat or not)."""
        if not self.is_young(origin):
            self._established_heard = (self._round, self._now())

    def established_heard_lately(self) -> bool:
        """An established key sent a verified group within `young_rounds` rounds or (with a clock)
        `establish_interval_s` seconds."""
        heard_round, heard_at = self._established_heard
        return (self._round - heard_round <= self.young_rounds
                or (self.clock is not None and self._now() - heard_at <= self.establish_interval_s))

    def _earn(self, earned: float) -> float:
        return min(self._slot_credit + earned, max(1.0, earned))

    def spend(self, n: int) -> None:
        self._slot_credit -= n

    def _make_room(self) -> None:
        """Keeps the key table bounded: forgets the record worth least (module doc)."""
        if len(self.keys) < self.max_keys:
            return

        def worth(key: str) -> tuple:
            r = self.keys[key]
            return not self.is_young(key), r.credited, r.last_active, r.pooled > 0, -r.arrival

        del self.keys[min(self.keys, key=worth)]

    # -- restarts ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Key records and the dedup memory (JSON-able). Pool membership is not kept: the pool
        itself starts empty after a restart."""
        return {"version": STATE_VERSION, "round": self._round, "arrivals": self._arrivals,
                "slot_credit": self._slot_credit,
                "keys": [[key, r.first_seen, r.arrival, r.credited, r.last_active, r.first_seen_s, r.established_at,
                          r.group, r.last_credited_s] for key, r in self.keys.items()],
                "credited": [[digest, round_index, at] for digest, (round_index, at) in self._credited.items()]}

    def load_state_dict(self, state: dict) -> None:
        """Replaces this state with `state`; raises ValueError (leaving this state as it was) if it
        is not a state this version (or version 1) wrote."""
        try:
            version = state["version"]
            if version not in (1, 2, STATE_VERSION):
                raise ValueError(f"admission state version {version!r}, expected 1 to {STATE_VERSION}")
            keys = OrderedDict(_key_record(entry) for entry in state["keys"][-self.max_keys:])
            credited = OrderedDict((str(entry[0]), (int(entry[1]), float(entry[2]) if len(entry) > 2 else 0.0))
                                   for entry in state["credited"][-MAX_REMEMBERED:])
            round_index, arrivals = int(state["round"]), int(state["arrivals"])
            slot_credit = float(state["slot_credit"])
            if not -1.0 <= slot_credit <= 1e6:  # split re-caps it; this only refuses nonsense (nan too)
                raise ValueError(f"slot credit {slot_credit}")
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise ValueError(f"not an admission state: {err!r}") from err
        self.keys, self._credited = keys, credited
        self._pooled = set()
        self._round, self._arrivals, self._slot_credit = round_index, arrivals, slot_credit
        self._group_promoted = {}
        for record in self.keys.values():  # each group's latest promotion: its interval holds across a restart
            if record.established_at:
                self._group_promoted[record.group] = max(self._group_promoted.get(record.group, 0.0), record.established_at)
        if version == 1:  # no times then: the keys that earned their credits and rounds were established
            for record in self.keys.values():
                record.established_at = self._now() if self._earned(record) else 0.0
        self.any_established = any(not self.is_young(key) for key in self.keys)


def _key_record(entry: list) -> tuple[str, KeyRecord]:
    """A saved key row: [key, first_seen, arrival, credited, last_active] (+ first_seen_s,
    established_at since version 2; + group, last_credited_s since version 3)."""
    key, first, arrival, credited, active = entry[:5]
    first_s, established_at = (float(entry[5]), float(entry[6])) if len(entry) >= 7 else (0.0, 0.0)
    group, last_credited = (str(entry[7]), float(entry[8])) if len(entry) >= 9 else ("", established_at)
    return str(key), KeyRecord(first_seen=int(first), arrival=int(arrival), credited=int(credited),
                               last_active=int(active), first_seen_s=first_s, established_at=established_at,
                               group=group, last_credited_s=last_credited)

