"""Everything that touches the model: loading, generation, log-probs, advantages, losses, updates,
checkpoints. Imports neither `node` (but its stdlib-only ground floor, node/ground/) nor `protocol`."""
