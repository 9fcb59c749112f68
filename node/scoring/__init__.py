"""Turning a completion into a reward: answer extraction and the Verifier (verifiers.py), a cheap look
for compute bombs before parsing (answer_filter.py), and killable worker processes that score
untrusted text under a deadline (sandbox.py, each worker: sandbox_worker.py)."""
