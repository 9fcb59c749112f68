"""Everything a peer sends, and what we send them (SAPO): the exchange (exchange.py, its options in
exchange_options.py, hints in exchange_hints.py, status in exchange_status.py, what its audit draws
from in audit.py), where a peer's message is checked (peek.py before
the Ingress, verify.py after it; reasons.py and refusals.py name and count refusals), background
ingest (ingest.py; the key each delivering host publishes for, signers.py), the bounded pool
(pool.py), admission of keys and content (admission.py),
behaviour tiers (tiers.py), the wire types (wire.py), waiting hint requests (hint_requests.py) and
the self-replay silo control (self_replay.py)."""
