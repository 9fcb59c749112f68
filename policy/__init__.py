"""Everything that touches the model: loading, generation, log-probs, advantages, losses, updates,
checkpoints. Imports neither `node` nor `protocol` (its stdlib plumbing is policy/ground.py)."""
