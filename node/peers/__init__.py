"""Everything a peer sends, and what we send them (SAPO). The exchange (exchange.py) is a facade over
the inbound path's stages, run in order by intake.py: skim.py (an unauthenticated look that drops
what needs no trust), gate.py (the Ingress), precheck.py (the cheap checks, then the pool),
verification.py (the expensive checks of verify.py's pure steps, for the mix's picks and ahead of
them) and audit.py; ledger.py is the one owner that counts and blames (reasons.py and refusals.py
name and log refusals). Beside them: its options (exchange_options.py), hints (exchange_hints.py),
status (exchange_status.py), publishing (outbound.py), background ingest (ingest.py; the key each
delivering host publishes for, signers.py), the bounded pool (pool.py), admission of keys and
content (admission.py), behaviour tiers (tiers.py), the wire types (wire.py), waiting hint requests
(hint_requests.py) and the self-replay silo control (self_replay.py)."""
