"""Measure the "fast" device profile of a preset for the compute-clock testnet (node/testnet/clock.py).

    python scripts/measure_profile.py --preset tiny [--rounds 40] [--set key=value ...]

Runs one Node alone on one CPU thread at 8 and at 2 prompts per round (what mixes 8/0 and 2/6
generate) and fits time = fixed + tokens / rate through the two points, for generation and for
training: the slopes are the token rates, the intercepts (plus the rest of the round: scoring,
composing) the per-round overhead. Prints them and the MEASURED line to paste. Alone, with no
exchange, so t_exchange is 0; the first two rounds are warmup and not counted.
"""
from __future__ import annotations

import argparse
import tempfile
from statistics import mean

from node.config import load_config
from node.loop import Node

WARMUP = 2


def measure(preset: str, prompts: int, rounds: int, extra: list[str]) -> dict[str, float]:
    overrides = ["run.threads=1", "eval.every=0", f"tasks.prompts_per_round={prompts}", "run.checkpoint_every=100000",
                 *extra]
    with tempfile.TemporaryDirectory() as run_dir:
        node = Node(load_config(preset, None, overrides), run_dir)
        rows = [node.run_round(i) for i in range(rounds + WARMUP)][WARMUP:]
    other = [r["t_round"] - r["t_generate"] - r["t_train"] for r in rows]
    return {key: mean(r.get(key, 0.0) for r in rows) for key in
            ("tokens_generated", "t_generate", "tokens_trained", "t_train")} | {"t_other": mean(other)}


def fit(a: dict, b: dict, tokens: str, seconds: str) -> tuple[float, float]:
    """(tokens/s, fixed seconds) of the line through two measurements."""
    slope = (a[seconds] - b[seconds]) / (a[tokens] - b[tokens])
    return 1.0 / slope, a[seconds] - slope * a[tokens]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, as the testnet's --set (e.g. sampling.max_new_tokens=48)")
    args = parser.parse_args()
    big, small = (measure(args.preset, prompts, args.rounds, args.overrides) for prompts in (8, 2))
    gen_rate, gen_fixed = fit(big, small, "tokens_generated", "t_generate")
    train_rate, train_fixed = fit(big, small, "tokens_trained", "t_train")
    overhead = max(0.0, gen_fixed) + max(0.0, train_fixed) + mean([big["t_other"], small["t_other"]])
    for name, m in (("8 prompts", big), ("2 prompts", small)):
        print(f"{name}: {m['tokens_generated']:.0f} tokens generated in {m['t_generate']:.4f} s, "
              f"{m['tokens_trained']:.0f} trained in {m['t_train']:.4f} s, other {m['t_other']:.4f} s")
    print(f"generation {gen_rate:.0f} tokens/s + {gen_fixed:.4f} s; training {train_rate:.0f} tokens/s + "
          f"{train_fixed:.4f} s; overhead per round {overhead:.4f} s")
    print(f'    "{args.preset}": DeviceProfile("fast", gen_tokens_per_s={gen_rate:.4g}, '
          f"train_tokens_per_s={train_rate:.4g}, round_overhead_s={overhead:.3g}),")


if __name__ == "__main__":
    main()
