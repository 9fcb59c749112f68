"""The Ingress stage of the inbound path (node/peers/exchange.py): transport bytes -> an authenticated message.

`Gate.accept` puts a message through protocol.Ingress (signature, limits, replay, rate, bans; it
counts and logs its own refusals), counted as `messages_checked` and timed as the `ingress` phase,
and remembers which key each delivering host was authenticated publishing for
(node/peers/signers.py): `sender_class` goes by that key, for staging's lanes (node/peers/ingest.py)
and the hint-request queue, which both run before the Ingress.
"""
from __future__ import annotations

from node.peers.ingest import ESTABLISHED, YOUNG
from node.peers.ledger import Ledger
from node.peers.pool import GroupPool
from node.peers.signers import SEVERAL, HostSigners
from protocol import Ingress, Kind, Verified
from protocol.transports.base import Received


class Gate:
    """Stage: a Received message -> Verified (its signer and decoded body), or None: refused by the Ingress."""

    def __init__(self, ingress: Ingress, ledger: Ledger, pool: GroupPool):
        self.ingress, self.ledger, self.pool = ingress, ledger, pool
        self.signers = HostSigners()  # the key each delivering host publishes for (guarded by the ledger's lock)

    def accept(self, item: Received, kinds: set[Kind]) -> Verified | None:
        """One message through the Ingress, counted (messages_checked) and timed."""
        self.ledger.count("messages_checked")
        with self.ledger.timed("ingress"):
            verified = self.ingress.accept_received(item, kinds)
        self._note_signers([verified] if verified is not None else [])
        return verified

    def accept_many(self, items: list[Received], kinds: set[Kind]) -> list[Verified]:
        """A whole drain through the Ingress at once (its rate limits see the burst), counted and timed."""
        self.ledger.count("messages_checked", len(items))
        with self.ledger.timed("ingress"):
            accepted = self.ingress.accept_many(items, kinds)
        self._note_signers(accepted)
        return accepted

    def sender_class(self, host: str) -> str:
        """Staging's lane (and the hint-request queue's class) for a delivering host: that of the key
        it was last authenticated publishing for (node/peers/signers.py; its own id until then),
        established at admission, or young (unknown, and a host delivering for several keys, included)."""
        with self.ledger.lock:
            signer = self.signers.signer_of(host)
            return YOUNG if signer == SEVERAL or self.pool.admission.is_young(signer) else ESTABLISHED

    def _note_signers(self, accepted: list[Verified]) -> None:
        with self.ledger.lock:
            for verified in accepted:
                self.signers.authenticated(verified.from_peer, verified.sender)
