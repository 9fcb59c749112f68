"""Skimming a peer's message: reading it without authenticating it, for the two decisions that need no trust.

The Ingress (signature, limits, replay, rate) is the most expensive check a message meets before
verification: about 0.27 ms a message checked on this project's CPU, 2.5 ms of an 8-node tiny-warm
node's round (docs/benchmarks.md "What a sharing round costs"). Two kinds of message are not worth
it when they arrive, and a skim (decode, no signature) tells which:
  * a peer's hint request, until this node can answer it (node/peers/hint_requests.py);
  * a rollout group whose claimed rewards have no variance, published by an *established* key
    under its own transport origin: SAPO would not train it, so it is dropped unchecked. Dropping
    cannot hurt anyone: the worst a forgery achieves is that a message goes unused. The node keeps
    the latest such message per origin for the audit (node/peers/audit.py), which puts it through
    the Ingress and verification all the same, so an established sender that lies in its
    zero-variance claims is still caught and banned. The origin is the transport's (GossipSub's
    authenticated from_id): a key claimed by someone else's message is never skimmed, and a
    young or unknown key's zero-variance group goes through everything (it can earn credit).
Anything a skim cannot parse goes through the Ingress, which says why it is refused.

`Skim` is the first stage of the inbound path for rollout groups (node/peers/exchange.py): a
message in, the same message out to go on to the Ingress, or None: skimmed.
"""
from __future__ import annotations

from node.peers.audit import Unaudited
from node.peers.ledger import Ledger
from node.peers.pool import GroupPool
from node.peers.verify import claims_flat
from node.peers.wire import local_task_ref
from protocol import Ingress, Kind, Limits
from protocol.envelope import decode_body, decode_envelope
from protocol.identity import peer_id_from_public_key
from protocol.transports.base import Received

YOUNG_FLAT_POOLED = 2  # a young key's pooled groups beyond which its zero-variance claims are skimmed


def skim_task_ref(item: Received, limits: Limits):
    """The TaskRef a hint request names, read without authenticating it; None if it does not parse
    as one (the Ingress then refuses it with the reason, charged to whoever it proves)."""
    try:
        envelope = decode_envelope(bytes(item.data), limits)
        if envelope.kind != Kind.HINT_REQUEST:
            return None
        return local_task_ref(decode_body(envelope).task_ref)
    except Exception:  # any malformed input: the Ingress says why
        return None


def flat_claim_of_origin(item: Received, limits: Limits) -> bool:
    """The message is a rollout group, signed (by its claim) with its transport origin's key, and its
    claimed rewards are all equal. Nothing is authenticated: see the module doc."""
    try:
        envelope = decode_envelope(bytes(item.data), limits)
        if envelope.kind != Kind.ROLLOUT_GROUP or peer_id_from_public_key(envelope.sender_public_key) != item.from_peer:
            return False
        body = decode_body(envelope)
        return len(body.completions) > 0 and claims_flat(body)  # an empty group: the Ingress refuses it
    except Exception:  # any malformed input: the Ingress says why
        return False


class Skim:
    """Stage: a rollout message (Received) -> the same message, for the Ingress, or None when it is
    an unbanned origin's own zero-variance claim that the pool has no use for: dropped unchecked,
    counted (messages_skimmed, the `skim` phase) and kept as the origin's latest for the audit. An
    established key's always; a young key's once YOUNG_FLAT_POOLED of its groups wait in the pool (a
    young slot credits one a round at most). Cross-actor composition merges such groups: `enabled`
    False, nothing is skimmed."""

    def __init__(self, ledger: Ledger, ingress: Ingress, pool: GroupPool, unaudited: Unaudited, limits: Limits,
                 enabled: bool = True):
        self.ledger, self.ingress, self.pool, self.unaudited = ledger, ingress, pool, unaudited
        self.limits, self.enabled = limits, enabled

    def skim(self, item: Received) -> Received | None:
        origin = item.from_peer
        if not self.enabled or self.ingress.is_banned(origin):
            return item
        with self.ledger.lock:
            if self.pool.admission.is_young(origin) and self.pool.held_by(origin) < YOUNG_FLAT_POOLED:
                return item
        with self.ledger.timed("skim"):
            flat = flat_claim_of_origin(item, self.limits)
        if not flat:
            return item
        with self.ledger.lock:
            self.ledger.arrival(flat=True)
            self.ledger.count("messages_skimmed")
            self.unaudited.remember(origin, item)
        return None
