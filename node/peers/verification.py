"""The verification stage of the inbound path (node/peers/exchange.py): a pooled Candidate -> a ScoredGroup.

The expensive checks of node/peers/verify.py: every reward recomputed by our verifier (a
disagreeing claim counts against the signer), the text re-tokenized, each completion's behavior
tier picked (node/peers/tiers.py). Outcomes go to the ledger (node/peers/ledger.py), which counts and
blames. Three callers are handed this object, and none of them calls back into the exchange:
  the pool's picks (node/peers/pool.py `sample` / `take_matching`: `verify_pick`), on the training
      thread, within its per-round budget (node/peers/verify_budget.py);
  the ingest worker's spare time (node/peers/ingest.py: `verify_ahead`), one pooled group before a
      pick asks for it, scored outside the lock (a slow scorer never holds up collect; picks skip it
      meanwhile);
  the audit (node/peers/audit.py: `verify_candidate`, `verify_group`), within the same budget.
A group that fails leaves the pool and benches its key (node/peers/bench.py).
"""
from __future__ import annotations

from node.peers.audit import Unaudited
from node.peers.ledger import Ledger
from node.peers.pool import GroupPool
from node.peers.verify import Candidate, Refusal, VerifyContext, precheck_group, score_candidate, verify_candidate
from node.peers.verify_budget import VerifyBudget
from node.scoring.sandbox import SandboxBusy
from node.train.groups import ScoredGroup
from proto import swarm_pb2


class Verification:
    """Stage: a Candidate (or a RolloutGroup, both stages) -> a ScoredGroup, or a Refusal the ledger
    counted. `budget`: the training thread's (the picks' and the audit's); `ahead_until`: the worker
    verifies ahead while fewer pooled groups than this wait verified."""

    def __init__(self, ledger: Ledger, pool: GroupPool, unaudited: Unaudited, context: VerifyContext,
                 budget: VerifyBudget, ahead_until: int):
        self.ledger, self.pool, self.unaudited, self.context = ledger, pool, unaudited, context
        self.budget, self.ahead_until = budget, ahead_until

    def verify_pick(self, group: Candidate | ScoredGroup) -> ScoredGroup | str | None:
        """What the pool asks of a pick: verified within the round's budget, its refusal's reason, or
        None (the budget is spent)."""
        if isinstance(group, ScoredGroup):  # verified ahead (the ingest worker) or by an audit
            return group
        verdict = self.budget.run(lambda left: self.verify_candidate(group, left))
        return verdict.reason if isinstance(verdict, Refusal) else verdict

    def verify_ahead(self) -> bool:
        """The ingest worker's spare time: one pooled group verified before a pick asks, scored outside
        the lock (module doc). False when there is none worth it."""
        with self.ledger.lock:
            candidate = self.pool.next_unverified(most_verified=self.ahead_until)
            if candidate is None:
                return False
            self.ledger.count("groups_verified")
            self.ledger.count("groups_verified_ahead")
            self.unaudited.forget(candidate.origin, candidate)
            self.pool.verifying.add(id(candidate))
        try:
            scores = score_candidate(candidate, self.context)
        finally:
            self.pool.verifying.discard(id(candidate))  # one set operation: atomic, no lock needed
        with self.ledger.lock:
            verdict = self.ledger.verdict(candidate.origin, verify_candidate(candidate, self.context, scores))
            if isinstance(verdict, Refusal):
                self.pool.failed(candidate.origin, verdict.reason, candidate)
            else:
                self.pool.replace_unverified(candidate, verdict)
        return True

    def verify_candidate(self, candidate: Candidate, timeout_s: float | None = None) -> ScoredGroup | Refusal | None:
        """The expensive checks of a prechecked group, counted; `timeout_s`: a scorer deadline shorter
        than the verifier's (what is left of the budget), and as long as it waits for a scorer sandbox
        busy with the worker's verification ahead: past that, None (nothing checked, nobody blamed: the
        group stays pooled, counted as `verify_sandbox_busy`), as when the budget is spent."""
        with self.ledger.lock:
            try:
                scores = score_candidate(candidate, self.context, timeout_s)
            except SandboxBusy:
                self.ledger.observe("verify_sandbox_busy")
                return None
            self.ledger.count("groups_verified")
            self.unaudited.forget(candidate.origin, candidate)
            verdict = verify_candidate(candidate, self.context, scores)
        return self.ledger.verdict(candidate.origin, verdict)

    def verify_group(self, sender: str, msg: swarm_pb2.RolloutGroup,
                     timeout_s: float | None = None) -> ScoredGroup | Refusal | None:
        """A peer's group through both stages of node/peers/verify.py now (an audited zero-variance claim)."""
        with self.ledger.lock:
            candidate = precheck_group(sender, msg, self.context)
        if isinstance(candidate, Refusal):
            return self.ledger.verdict(sender, candidate)
        return self.verify_candidate(candidate, timeout_s)
