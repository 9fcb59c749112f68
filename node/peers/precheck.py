"""The precheck and pooling stages of the inbound path (node/peers/exchange.py).

    Verified rollout group -> Precheck.check -> Candidate -> Pooling.put -> the pool, still unverified

`Precheck` runs the cheap checks (node/peers/verify.py `precheck_group`: the task rebuilt from the
TaskRef, never the sender's copy; lengths bounded) on an authenticated group. A group whose claimed
rewards have no variance goes no further unless the pool can use it (a young key's earns it
credit; cross-actor composition merges such groups): it is only kept for the audit
(node/peers/audit.py). `Pooling` pools what passed (node/peers/pool.py) and places its signer in a
network group for admission (node/peers/admission.py). Verification comes later, when the mix picks
the group or the ingest worker verifies it ahead (node/peers/verification.py). Refusals go to the
ledger (node/peers/ledger.py), which counts and blames.
"""
from __future__ import annotations

from typing import Callable

from node.peers.audit import Unaudited
from node.peers.ledger import Ledger
from node.peers.pool import GroupPool, PoolEntry
from node.peers.reasons import OWN
from node.peers.verify import Candidate, Refusal, VerifyContext, claims_flat, precheck_group
from protocol import Verified


class Precheck:
    """Stage: an authenticated rollout group (Verified) -> a Candidate, or None: refused (the ledger
    counted why) or a zero-variance claim the pool has no use for (kept for the audit).
    `keep_flat`: cross-actor composition, which pools every zero-variance group."""

    def __init__(self, peer_id: str, ledger: Ledger, pool: GroupPool, unaudited: Unaudited,
                 context: VerifyContext, keep_flat: bool = False):
        self.peer_id, self.ledger, self.pool, self.unaudited = peer_id, ledger, pool, unaudited
        self.context, self.keep_flat = context, keep_flat

    def check(self, verified: Verified) -> Candidate | None:
        sender, msg = verified.sender, verified.body
        if sender == self.peer_id:
            self.ledger.refuse(sender, Refusal(OWN))
            return None
        with self.ledger.lock:
            flat = claims_flat(msg)  # as its sender claims: only a pick or the audit checks it
            self.ledger.arrival(flat)
            self.pool.admission.heard(sender)
            if flat and not self.keep_flat and not self.pool.wants_flat(sender):
                self.unaudited.remember(sender, msg)
                return None  # SAPO: zero-variance groups carry no signal on their own (a young key's earns it credit)
            with self.ledger.timed("precheck"):
                candidate = precheck_group(sender, msg, self.context)
        if isinstance(candidate, Refusal):
            self.ledger.refuse(sender, candidate)
            return None
        return candidate


class Pooling:
    """Stage: a Candidate (and the Verified message it came in) -> pooled unverified (the sender's
    oldest may make room), remembered for the audit, its signer placed in a network group for
    admission. `network_group(peer)`: the transport's (node/peers/admission.py; "" where unknown)."""

    def __init__(self, ledger: Ledger, pool: GroupPool, unaudited: Unaudited,
                 network_group: Callable[[str], str] = lambda peer_id: ""):
        self.ledger, self.pool, self.unaudited, self.network_group = ledger, pool, unaudited, network_group

    def put(self, candidate: Candidate, verified: Verified, round_index: int) -> None:
        with self.ledger.lock:
            self.unaudited.remember(candidate.origin, candidate)
            if self.pool.add(PoolEntry(candidate, round_index, self.pool.now())):
                self.ledger.observe("pool_sender_cap")  # the sender's oldest pooled group made room
            self.pool.admission.place(candidate.origin, self.delivering_group(verified))

    def delivering_group(self, verified: Verified) -> str:
        """The network group admission counts a signer in: its own host's where we are (or were)
        connected to it, else that of the neighbour that delivered the group."""
        return self.network_group(verified.sender) or (verified.neighbour and self.network_group(verified.neighbour))
