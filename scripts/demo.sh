#!/usr/bin/env bash
# The main job on embedded defaults: the swarm against the silo at equal compute. Eight tiny nodes,
# warm-started so that they solve three-digit tasks only now and then (preset tiny-warm), train
# alone (mix 8/0) and then together (4/4: four own groups and four verified peer groups per
# update, real signed messages over the in-memory bus), each round charged its compute on a
# measured device profile, until the same virtual time budget. Ends with the summary, the gain in
# one line, and testnet.png (held-out pass@1 over virtual time, swarm and silo on one panel).
# Each call runs in its own directory (OUT overrides it); extra arguments go to `swarm-node testnet`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${OUT:-runs/demo-$(date +%Y%m%d-%H%M%S)}
.venv/bin/swarm-node testnet --transport memory --preset tiny-warm --homogeneous --nodes 8 --rounds 300 \
    --compare 8/0,4/4 --out "$out" "$@"
echo "plot: $out/testnet.png"
