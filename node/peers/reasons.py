"""Every reason this node refuses a peer's message for, after protocol.Ingress accepted its bytes.

One vocabulary: the strings are counted under `rejected_by_reason` in `swarm-node status` (beside
the Ingress's own, protocol/errors.py: Reason), logged by node/peers/refusals.py and listed in
proto/PROTOCOL.md ("Reject reasons"). The reasons reported against the signer are
the protocol's scoring events (protocol/scoring.py), so what we count and what we report to the
Ingress are the same string.
"""
from __future__ import annotations

from protocol.scoring import HINT_LEAK, UNCONFIGURED_TASK, UNKNOWN_TASK, WRONG_REWARD

# Reported to the Ingress against the signer (node/peers/verify.py decides; node/peers/ledger.py reports).
UNKNOWN = UNKNOWN_TASK            # TaskRef we cannot rebuild (and sender answers not accepted)
NOT_CONFIGURED = UNCONFIGURED_TASK  # ... because it names a source, family or seed we lack: nothing net
MISMATCH = WRONG_REWARD           # claimed reward disagrees with our recomputation (same verifier)
LEAK = HINT_LEAK                  # a hint containing the task's answer
# Never blamed: an honest peer with another model, task set or scorer budget can cause them.
TIMEOUT = "score_timeout"         # our scorer ran out of time on a completion: cannot verify
REFUSED = "score_refused"         # an answer shaped like a compute bomb (node/scoring/answer_filter.py)
UNTOKENIZABLE = "untokenizable"   # text our tokenizer cannot encode (e.g. outside the tiny vocab)
TOO_LONG = "too_long"             # longer in our tokens than we would ever train on
GROUP_TOO_LONG = "group_too_long"  # more tokens in all than a group of ours could have
OWN = "own_message"               # our own message echoed back (gossip relays can do this)
HINTED = "hinted_group"           # completions conditioned on a hint we cannot see: not shared
HINT_REQUEST_UNKNOWN = "hint_request_unknown_task"  # a request for a task we cannot build
DUPLICATE = "duplicate_content"   # content already pooled or trained recently (node/peers/admission.py)
VERIFY_ERROR = "verify_error"     # verifying peer data raised in our code: the message is dropped
# Not a peer's message at all: one of OUR messages broke a limit peers enforce (counted, not refused).
OUTBOUND_INVALID = "outbound_invalid"
# Not a rejection (we train on our own rewards): another verifier's claim differs from ours,
# counted under `observed`.
DISAGREES = "reward_disagrees"

BLAMED = frozenset({UNKNOWN, NOT_CONFIGURED, MISMATCH, LEAK})
