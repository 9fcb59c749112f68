#!/usr/bin/env bash
# The main job on embedded defaults: the swarm against the silo at equal compute, on three paired
# seeds. Tiny nodes warm-started so that they solve three-digit tasks only now and then (preset
# tiny-warm: only verified successes train, ours and peers'), three per testnet, train alone (mix
# 8/0) and then together (4/4: four own groups and four verified peer groups per update, real
# signed messages over the in-memory bus), each round charged its compute on a measured device
# profile (generation, training, checking, verifying and publishing), until the same virtual budget
# (7.46 s: what the default silo of scripts/experiments/skeptic.py needs for 300 rounds on the clock
# refitted 2026-11-29, node/testnet/clock.py). Seed s gives both
# mixes the same warm model and task draws; the six runs go two at a time, one per core. Ends with
# the summary, the paired difference with its 95% CI (the verdict), and testnet.png. Each call runs
# in its own directory (OUT overrides it); extra arguments go to `swarm-node testnet`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${OUT:-runs/demo-$(date +%Y%m%d-%H%M%S)}
.venv/bin/swarm-node testnet --transport memory --preset tiny-warm --homogeneous --nodes 3 --seeds 3 \
    --workers 2 --budget 7.46s --compare 8/0,4/4 --out "$out" "$@"
echo "plot: $out/testnet.png"
echo "what the gain is made of (the skeptic's test: docs/testnets-and-experiments.md): peers' verified successes, which" \
     "a silo replaying its own never matches; +0.24 on 8 seeds, not confirmed (+0.04, CI includes 0) on 8 fresh ones"
