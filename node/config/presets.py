"""The presets: plain override dicts on top of the config's defaults (node/config/schema.py), so a reader
sees exactly what differs. Imports nothing: the command line lists the preset names without loading
the config's schema (pydantic and every section's module)."""
from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # A 2-layer, 64-wide Qwen2 with a 16-token vocabulary learning one-token arithmetic from scratch
    # (node/tasks/synthetic.py: copy learns in ~300 rounds, succ/max reach >= 0.99 within 1,500 at lr 1e-3).
    "tiny": {
        "model": {"name": "tiny"},
        "tasks": {"source": "synthetic", "datasets": {"copy": 1.0, "succ": 1.0, "max": 1.0},
                  "prompts_per_round": 16},
        "sampling": {"group_size": 8, "temperature": 1.0, "max_new_tokens": 1, "backend": "hf"},
        "verifier": {"fmt": "raw"},
        "optim": {"lr": 1e-3},
        "run": {"rounds": 600, "checkpoint_every": 50},
        # held-out copy/succ/max + "add", the family it never trains (the real generalisation check)
        "eval": {"every": 50, "ood": {"add": 1.0}},
    },
    # The rare-success miniature (node/train/warm_start.py): the tiny model warm-started on a noisy corpus,
    # then RL on three-digit families it solves about 10% (rev) and 1% (inc, rot) of the time, whose
    # held-out questions are never trained on. Chance success is about 1 in 65,000.
    "tiny-warm": {
        "model": {"name": "tiny"},
        "warm": {"recipe": "digits3"},
        "tasks": {"source": "synthetic", "datasets": {"rev": 1.0, "inc": 1.0, "rot": 1.0},
                  "prompts_per_round": 8},
        "sampling": {"group_size": 8, "temperature": 1.0, "max_new_tokens": 4, "backend": "hf"},
        "verifier": {"fmt": "raw"},
        # only verified successes train, ours as well as peers': in this rare-success regime it beat training
        # our failures, alone and in the swarm (docs/testnets-and-experiments.md "The swarm against the silo",
        # scripts/experiments/skeptic.py)
        "loss": {"off_policy": {"own_failures": "drop"}},
        "optim": {"lr": 1e-3},
        "run": {"rounds": 300, "checkpoint_every": 50},
        "eval": {"every": 25, "tasks_per_family": 64},
    },
    # SmolLM2-135M-Instruct (offline GGUF, converted once to bf16) on real reasoning-gym tasks.
    "smollm2": {
        # float32 master weights (an lr of 1e-6 would vanish in bf16 weights); bf16 autocast where the
        # hardware has native bf16 (emulated bf16 on an AVX2-only CPU made generation ~5x slower)
        "model": {"name": "smollm2", "dtype": "float32"},
        "tasks": {"source": "reasoning_gym",
                  "datasets": {"basic_arithmetic": {"weight": 1.0, "config": {"min_terms": 2, "max_terms": 2,
                                                                             "min_digits": 1, "max_digits": 1}},
                               "leg_counting": {"weight": 1.0, "config": {"min_animals": 1, "max_animals": 2}}},
                  "prompts_per_round": 4},
        "sampling": {"group_size": 4, "temperature": 1.0, "max_new_tokens": 96},
        "verifier": {"fmt": "lenient", "format_weight": 0.1},
        "optim": {"lr": 1e-6, "autocast_bf16": "auto"},
        # verifying a pick takes longer than at tiny (a 96-token text, reasoning-gym's scorers); a round, minutes
        "swarm": {"verify_budget_s": 2.0},
        "run": {"rounds": 20, "checkpoint_every": 1},
        # held-out basic_arithmetic/leg_counting + chain_sum (3 one-digit terms), never trained. One
        # evaluation = 8 tasks x 3 families x (1 greedy + 4 sampled) = 120 completions: about 8 rounds'
        # worth of generation (2 CPU cores: 146 s vs 18 s a round), hence every 20 rounds on a CPU preset
        "eval": {"every": 20, "tasks_per_family": 8,
                 "ood": {"chain_sum": {"weight": 1.0, "config": {"min_terms": 3, "max_terms": 3,
                                                                 "min_digits": 1, "max_digits": 1}}}},
    },
    # SmolLM2 sized to measure learning on one CPU thread (a node-round of 4 x 8 direct answers of a few
    # tokens): one family, basic_arithmetic with two terms of 1-2 digits, which it answers right about 1 time
    # in 13 before training (one-digit terms: 1 in 4, too easy to show a gain); held-out questions are a text
    # split (a fifth of the question texts, never trained at any seed, refused in peers' groups), 64 per
    # family, plus chain_sum with three one-digit terms out of distribution. lr 2e-5 was chosen on training
    # reward among 1e-5, 2e-5 and 4e-5, fixed before they ran (scripts/experiments/regime.py, 3 seeds x 100
    # rounds on an H200: held-out 0.062 -> 0.266 on all three seeds; docs/testnets-and-experiments.md
    # "A SmolLM2 regime that moves").
    "smollm2-arith": {
        "model": {"name": "smollm2", "dtype": "float32"},
        "tasks": {"source": "reasoning_gym", "heldout_split": 0.2, "prompts_per_round": 4,
                  "datasets": {"basic_arithmetic": {"weight": 1.0, "config": {"min_terms": 2, "max_terms": 2,
                                                                             "min_digits": 1, "max_digits": 2}}}},
        "sampling": {"group_size": 8, "temperature": 1.0, "max_new_tokens": 16, "answer_style": "direct"},
        "verifier": {"fmt": "lenient", "format_weight": 0.1},
        "optim": {"lr": 2e-5, "autocast_bf16": "auto"},
        "swarm": {"verify_budget_s": 2.0},
        "run": {"rounds": 60, "checkpoint_every": 20},
        "eval": {"every": 20, "tasks_per_family": 64, "k": 8,
                 "ood": {"chain_sum": {"weight": 1.0, "config": {"min_terms": 3, "max_terms": 3,
                                                                 "min_digits": 1, "max_digits": 1}}}},
    },
}
