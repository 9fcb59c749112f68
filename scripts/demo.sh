#!/usr/bin/env bash
# The main job on embedded defaults: a small testnet -- 3 heterogeneous tiny nodes, each a real
# `swarm-node join` process sharing verified rollouts over libp2p on 127.0.0.1 (mix 4/4) -- then
# its report: the summary on the terminal, testnet.png and testnet.json in the run directory.
# Each call runs a fresh testnet in its own directory (OUT overrides it); extra arguments go to
# `swarm-node testnet` (e.g. --transport memory, --nodes 8, --hostile 1:liar).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${OUT:-runs/demo-$(date +%Y%m%d-%H%M%S)}
.venv/bin/swarm-node testnet --nodes 3 --rounds 200 --mix 4/4 --out "$out" "$@"
echo "plot: $out/testnet.png"
