"""Which verified peer groups may enter the external mix: content dedup across signers, and the
weight new keys earn. Identities are free (anyone can make 100 keys), so neither rule trusts a key.

Duplicates: a group's content digest covers its prompt and its completion texts (order and runs
of whitespace ignored), not the signer. A group whose content is already in the pool, or was
credited within the last `remember_rounds` rounds, is refused as `duplicate_content`: one honest
group re-signed by 100 keys is trained (or credited) at most once. Neither signer is blamed (two
honest peers can produce the same group of short answers). Only credited groups are remembered, so
the memory grows with this node's own rounds (at most J + I groups a round), never with what
peers send.

Young keys: a key is young until both `young_groups` of its verified, valid, non-duplicate groups
were credited and its first such group arrived `young_rounds` rounds ago. A group is credited when
this node trains on it, or, for a young key, when one of the young slots picks it although it has
no reward variance (verified, but nothing to train on): an honest peer that has solved its tasks
sends mostly such groups, and would otherwise stay young forever. Young keys together hold at most
`young_share_max` of the external mix (with J = 4: one young group beside three established ones,
and fewer when established keys offer fewer; a fraction carries over), and in a round with no
established group at most that share of the J slots (0.25 of J = 2 is one slot every other round),
trained or credited alike. They are served in order of first appearance (keys still short of
`young_groups` credits first), so a burst of fresh keys queues behind earlier
newcomers and never crowds out established peers: with the defaults, fresh keys can become
established at most one per `young_groups` rounds (J = 4), each after `young_rounds` rounds. A new
swarm starts with every key young: its external mix fills at that share until peers have earned
weight.

Key table: at most `max_keys` records. When full, the record worth least goes: young before
established, fewest credits, longest inactive, nothing pooled, newest arrival, in that order. A
flood of fresh keys forgets itself; an active newcomer that has earned credit is never forgotten
for it.

Restarts: `state_dict` / `load_state_dict` carry key records, credits and the dedup memory across a
checkpoint (node/loop.py saves them with the model), so a restart neither makes every key young
again nor forgets what was trained.
"""
from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass

from node.groups import ScoredGroup
from node.reasons import DUPLICATE  # the refusal admission decides (node/pool.py counts it)

MAX_KEYS = 4096  # key records kept; beyond it the record worth least is forgotten (see _make_room)
STATE_VERSION = 1


@dataclass
class KeyRecord:
    first_seen: int   # round of its first admitted group
    arrival: int      # admission order, to break ties within a round
    credited: int = 0  # its verified, non-duplicate groups trained on or credited without variance
    pooled: int = 0   # its groups in the pool now
    last_active: int = 0  # round of its latest admitted group


def content_digest(group: ScoredGroup) -> str:
    """sha256 over the prompt and the sorted, whitespace-normalised completion texts."""
    texts = sorted(" ".join(r.text.split()) for r in group.rollouts)
    h = hashlib.sha256(group.task.prompt_key.encode())
    for text in texts:
        h.update(b"\0" + text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


class Admission:
    """The state behind both rules: digests pooled and credited, and what each key has earned."""

    def __init__(self, young_share_max: float, young_groups: int, young_rounds: int, remember_rounds: int,
                 max_keys: int = MAX_KEYS):
        if not 0.0 <= young_share_max <= 1.0:
            raise ValueError(f"young_share_max must be in [0, 1], got {young_share_max}")
        self.young_share_max = young_share_max
        self.young_groups = young_groups
        self.young_rounds = young_rounds
        self.remember_rounds = remember_rounds
        self.max_keys = max_keys
        self.keys: OrderedDict[str, KeyRecord] = OrderedDict()  # in order of first appearance
        self._pooled: set[str] = set()
        self._credited: OrderedDict[str, int] = OrderedDict()  # digest -> round credited, oldest first
        self._round = 0
        self._arrivals = 0
        self._slot_credit = 0.0  # young slots earned and not yet spent
        self.any_established = False  # some key established, as of the last start_round

    @classmethod
    def from_config(cls, cfg) -> Admission:
        return cls(cfg.young_share_max, cfg.young_groups, cfg.young_rounds, cfg.dedup_rounds)

    digest = staticmethod(content_digest)

    def admit(self, origin: str, digest: str, round_index: int) -> bool:
        """False for content already pooled or credited; else records the group as pooled."""
        if digest in self._pooled or digest in self._credited:
            return False
        record = self.keys.get(origin)
        if record is None:
            self._make_room()
            record = self.keys[origin] = KeyRecord(first_seen=round_index, arrival=self._arrivals)
            self._arrivals += 1
        record.pooled += 1
        record.last_active = max(record.last_active, round_index)
        self._pooled.add(digest)
        return True

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
        if digest:
            self._credited[digest] = self._round

    def start_round(self, round_index: int) -> None:
        self._round = round_index
        while self._credited and round_index - next(iter(self._credited.values())) > self.remember_rounds:
            self._credited.popitem(last=False)
        self.any_established = any(not self.is_young(key) for key in self.keys)  # once a round: O(keys)

    def is_young(self, origin: str) -> bool:
        record = self.keys.get(origin)
        return (record is None or record.credited < self.young_groups
                or self._round - record.first_seen < self.young_rounds)

    def seniority(self, origin: str) -> tuple[bool, int, int]:
        """Sort key among young keys: those still earning credits, then oldest first (a key that
        only waits for time does not hold the young slots)."""
        record = self.keys.get(origin)
        if record is None:  # forgotten while pooled (a full table of pooled keys): last in line
            return True, self._round, self._arrivals
        return record.credited >= self.young_groups, record.first_seen, record.arrival

    def split(self, k: int, young: int, established: int) -> tuple[int, int]:
        """This round's (young, established) slots out of k, given how many groups of each are
        eligible. Young keys hold at most `young_share_max` of the mix: each established group taken
        earns them share / (1 - share) of a slot. In a round with no established group (a new swarm)
        they earn share * k slots instead. Fractions carry over, capped so that quiet rounds never
        bank a burst; established keys fill what young ones leave."""
        share = self.young_share_max
        if established == 0 or share >= 1.0:
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
                "keys": [[key, r.first_seen, r.arrival, r.credited, r.last_active] for key, r in self.keys.items()],
                "credited": [[digest, round_index] for digest, round_index in self._credited.items()]}

    def load_state_dict(self, state: dict) -> None:
        """Replaces this state with `state`; raises ValueError (leaving this state as it was) if it
        is not a state this version wrote."""
        try:
            if state["version"] != STATE_VERSION:
                raise ValueError(f"admission state version {state['version']!r}, expected {STATE_VERSION}")
            keys = OrderedDict((str(key), KeyRecord(first_seen=int(first), arrival=int(arrival),
                                                    credited=int(credited), last_active=int(active)))
                               for key, first, arrival, credited, active in state["keys"][-self.max_keys:])
            credited = OrderedDict((str(digest), int(round_index)) for digest, round_index in state["credited"])
            round_index, arrivals = int(state["round"]), int(state["arrivals"])
            slot_credit = float(state["slot_credit"])
            if not -1.0 <= slot_credit <= 1e6:  # split re-caps it; this only refuses nonsense (nan too)
                raise ValueError(f"slot credit {slot_credit}")
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not an admission state: {err!r}") from err
        self.keys, self._credited = keys, credited
        self._pooled = set()
        self._round, self._arrivals, self._slot_credit = round_index, arrivals, slot_credit
        self.any_established = any(not self.is_young(key) for key in self.keys)
