"""The one exception of the protocol core and its closed set of rejection reasons.

Every check that can refuse a message raises `Rejected(reason, detail)`. `reason` is always one of
`Reason` (a str enum, so counters, logs and the Status map<string, uint64> see plain strings);
`detail` is free text for logs and must never be parsed.
"""
from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    # before authentication (attributed to the transport peer that handed us the bytes)
    BANNED = "banned"                      # sending peer or signing key is serving a ban
    RATE_LIMITED = "rate_limited"          # over the per-peer message or byte budget: dropped, no blame
    FLOODING = "flooding"                  # sustained far over that budget (ratelimit.py): scored
    WRONG_TOPIC = "wrong_topic"            # a kind that does not belong on the topic it came on
    OVERSIZED = "oversized"                # raw message larger than Limits.max_message_bytes
    MALFORMED = "malformed"                # not a decodable Envelope, or wrong key/signature length
    VERSION = "version"                    # protocol_version we do not speak
    UNKNOWN_KIND = "unknown_kind"          # kind outside the closed set
    BAD_SIGNATURE = "bad_signature"        # signature does not verify for the claimed key
    # after authentication (attributed to the signing key, except the delivery faults expired,
    # replay and stale: anyone can re-send a signed message, so those are the signer's fault never)
    CLOCK_SKEW = "clock_skew"              # timestamp too far in the future (only the signer can do that)
    EXPIRED = "expired"                    # timestamp too old: a late relay or a replay
    REPLAY = "replay"                      # (sender, sequence) already seen (a delivery fault, see ingress)
    STALE = "stale"                        # sequence behind the sender's replay window
    SCHEMA = "schema"                      # body does not decode, or a required field is missing/invalid
    NONFINITE_LOGPROB = "nonfinite_logprob"
    POSITIVE_LOGPROB = "positive_logprob"
    TOO_MANY_COMPLETIONS = "too_many_completions"
    TOO_MANY_TOKENS = "too_many_tokens"
    TEXT_TOO_LONG = "text_too_long"
    FLOAT_RANGE = "float_range"            # reward, temperature, top_p or log-prob outside its range
    BAD_OFFSETS = "bad_offsets"            # char offsets not monotone / beyond the text
    LENGTH_MISMATCH = "length_mismatch"    # log-probs or offsets not one per token
    # a bug in our own code path (never expected; counted so it cannot hide)
    INTERNAL = "internal"


class Rejected(Exception):
    """A message refused for `reason` (a `Reason`); `detail` says what exactly, for humans."""

    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else str(reason))
        self.reason = Reason(reason)
        self.detail = detail
