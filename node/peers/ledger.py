"""The inbound path's one owner of counts and blame: every stage counts through it (node/peers/exchange.py).

Each refusal of a peer's message, whichever stage makes it, goes to `refuse` (or `verdict`): counted by
reason for `swarm-node status`, logged (node/peers/refusals.py), and, where it is evidence against
the signer (`Refusal.blame`), reported to the Ingress, here and nowhere else. What a round's row
reports since the last collect is kept here too: the work the compute clock charges
(EXCHANGE_WORK, node/testnet/clock.py), the seconds of each phase (EXCHANGE_PHASES) and the groups
that arrived.

Thread-safety: `lock` (re-entrant) is the inbound path's one lock. It guards these counters and
everything the stages share: the pool, the audit memory, the hint queues, the host signers and
verification's tokenizer and task cache. The ingest worker's thread and the training thread both
take it (node/peers/exchange.py says for how long); one lock, so that no stage can see another's
state half-changed.
"""
from __future__ import annotations

import threading
from collections import Counter

from node.peers.reasons import DISAGREES
from node.peers.refusals import Refusals
from node.peers.verify import Refusal, timed
from node.train.groups import ScoredGroup
from protocol import Ingress

# the work a round row counts, what the compute clock charges: messages through the Ingress
# (signature, limits, replay), peer groups verified (re-score, re-tokenize, tier), messages signed
# and published, and zero-variance groups of established senders skimmed (node/peers/skim.py), never checked
EXCHANGE_WORK = ("messages_checked", "groups_verified", "messages_published", "messages_skimmed")
# where the exchange's seconds go, each a `t_exchange_<phase>` of the round's row (no two overlap):
# the skim that drops established senders' zero-variance claims, the Ingress, the cheap checks
# (precheck, less the task rebuild, which is its own phase), the expensive ones (score, retokenize,
# tier: the mix's picks, the audit and verification ahead), signing and publishing. In background
# mode skim, ingress and precheck run on the worker thread; node/train/loop.py adds
# `t_exchange_hints` (answering peers' requests).
EXCHANGE_PHASES = ("skim", "ingress", "precheck", "rebuild", "score", "retokenize", "tier", "publish")


class Ledger:
    """Counts, seconds and refusals of the inbound path (module doc); `ingress` hears the blame."""

    def __init__(self, ingress: Ingress):
        self.lock = threading.RLock()
        self.ingress = ingress
        self.rejected: Counter[str] = Counter()  # node-level reasons (the Ingress counts its own)
        self.observed: Counter[str] = Counter()  # things worth counting that are not rejections
        self.work: Counter[str] = Counter()  # EXCHANGE_WORK (and groups_verified_ahead) since the last collect
        self.seconds: Counter[str] = Counter()  # EXCHANGE_PHASES since the last collect
        self.arrived: Counter[str] = Counter(received=0, flat=0)  # peers' groups since the last collect
        self.refusals = Refusals(self.rejected, self.lock)  # counted and logged (rate-limited)
        self._rejected_at_last_round = 0

    def count(self, key: str, n: int = 1) -> None:
        """`n` more of the work `key` (EXCHANGE_WORK, or groups_verified_ahead)."""
        with self.lock:
            self.work[key] += n

    def observe(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.observed[key] += n

    def arrival(self, flat: bool) -> None:
        """A peer's group arrived (skimmed or authenticated); `flat`: its claimed rewards have no variance."""
        with self.lock:
            self.arrived["received"] += 1
            self.arrived["flat"] += flat

    def reject(self, reason: str) -> None:
        """A message dropped for `reason`, counted only: nobody is blamed, and the caller logged it
        if it is worth a line (a verify_error), or it is no peer's message (outbound_invalid)."""
        with self.lock:
            self.rejected[reason] += 1

    def add_seconds(self, phase: str, seconds: float) -> None:
        with self.lock:
            self.seconds[phase] += seconds

    def timed(self, phase: str):
        """A context manager adding the block's seconds to `phase`."""
        return timed(self.add_seconds, phase)

    def refuse(self, sender: str, refusal: Refusal) -> None:
        """Count and log a refusal; the only place evidence against a signer goes to the Ingress."""
        if refusal.disagreements:
            self.observe(DISAGREES, refusal.disagreements)
        self.refusals.add(refusal.reason, sender, refusal.detail)
        if refusal.blame:
            self.ingress.report(sender, refusal.reason)

    def verdict(self, sender: str, verdict: ScoredGroup | Refusal) -> ScoredGroup | Refusal:
        """A verification's outcome, counted: a refusal refused, a verified group's disagreements observed."""
        if isinstance(verdict, Refusal):
            self.refuse(sender, verdict)
            return verdict
        if verdict.meta["reward_disagreements"]:
            self.observe(DISAGREES, verdict.meta["reward_disagreements"])
        return verdict

    def take_arrived(self) -> tuple[int, int]:
        """Peers' groups (received, zero-variance claims among them) since the last call; starts over."""
        with self.lock:
            received, flat = self.arrived["received"], self.arrived["flat"]
            self.arrived = Counter(received=0, flat=0)
            return received, flat

    def take_round(self) -> tuple[Counter, dict[str, float], int]:
        """The work and each phase's seconds since the last call (none twice: the precheck's less the
        rebuild it timed), and the peer messages refused since; starts over."""
        with self.lock:
            work = Counter(self.work)
            seconds = {phase: self.seconds[phase] for phase in EXCHANGE_PHASES}
            seconds["precheck"] = max(0.0, seconds["precheck"] - seconds["rebuild"])
            rejected_now = sum(self.rejected.values())
            refused, self._rejected_at_last_round = rejected_now - self._rejected_at_last_round, rejected_now
            self.work.clear()
            self.seconds.clear()
            return work, seconds, refused

    def log_round(self, round_index: int) -> None:
        """One record of every peer message refused since the last round, the Ingress's and ours."""
        self.refusals.log_round(round_index, self.ingress.rejected_counts())
