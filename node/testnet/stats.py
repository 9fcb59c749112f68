"""Statistics for comparing arms over seeds: pure functions, lists of per-seed values in, dicts out,
so the testnet report (node/testnet/report_clock.py) and scripts comparing arms run by separate
testnet invocations use the same ones.

    sample_std          standard deviation over seeds with ddof=1 (None below 2 values)
    paired_comparison   per seed: arm - reference (the silo's run of the SAME seed: same warm model,
                        same task draws), their mean and a bootstrap confidence interval of that mean
                        (scipy.stats.bootstrap, BCa, 9,999 resamples, a fixed seed so reruns print the
                        same interval). Below 2 seeds there is no interval ("n/a" and why).
    learned_counts      per task family, how many node x seed runs "learned" it: held-out pass@1 on
                        that family at the budget above its value at t = 0 by at least one task
                        (one more held-out task solved), from node/train/eval.py's heldout_by_family.

A bootstrap interval over few seeds is too narrow (it sees only the spread the sample shows): with
3-5 seeds read it as a sign, not a proof.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.stats import bootstrap

CONFIDENCE = 0.95
RESAMPLES = 9999
BOOTSTRAP_SEED = 0  # fixed: the same per-seed values give the same interval on every run


def sample_std(values: Sequence[float]) -> float | None:
    """Standard deviation with ddof=1 (the sample's, not the population's); None below 2 values."""
    return float(np.std(np.asarray(values, dtype=float), ddof=1)) if len(values) >= 2 else None


def paired_differences(values: Sequence[float], reference: Sequence[float]) -> list[float]:
    """values[i] - reference[i]: the two lists are aligned by seed (the caller pairs them)."""
    if len(values) != len(reference):
        raise ValueError(f"paired differences need one reference value per seed: {len(values)} values, "
                         f"{len(reference)} reference values")
    return [float(a) - float(b) for a, b in zip(values, reference)]


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> dict:
    """Mean of `values` and a bootstrap confidence interval of it: {"n", "mean", "ci_low", "ci_high",
    "confidence", "note"}; the interval is None (note says why) below 2 values."""
    n = len(values)
    out = {"n": n, "mean": float(np.mean(values)) if n else None, "ci_low": None, "ci_high": None,
           "confidence": confidence, "note": None}
    if n < 2:
        out["note"] = f"n/a: {n} seed{'' if n == 1 else 's'}, a confidence interval needs at least 2"
        return out
    data = np.asarray(values, dtype=float)
    if np.ptp(data) == 0:  # every seed the same: the bootstrap has nothing to resample (BCa divides by 0)
        out.update(ci_low=float(data[0]), ci_high=float(data[0]), note="every seed gave the same value")
        return out
    with warnings.catch_warnings():  # BCa warns on near-degenerate samples; the interval is still reported
        warnings.simplefilter("ignore")
        result = bootstrap((data,), np.mean, confidence_level=confidence, n_resamples=RESAMPLES,
                           method="BCa", rng=BOOTSTRAP_SEED)
    low, high = (float(x) for x in result.confidence_interval)
    if math.isnan(low) or math.isnan(high):
        out["note"] = "n/a: the bootstrap interval is undefined for these values"
    else:
        out.update(ci_low=low, ci_high=high)
    return out


def paired_comparison(values: Sequence[float], reference: Sequence[float],
                      confidence: float = CONFIDENCE) -> dict:
    """Per-seed differences against the reference arm, their mean and its bootstrap interval (the
    per-seed differences are what is resampled: a paired bootstrap); "diffs" keeps them."""
    diffs = paired_differences(values, reference)
    return {**mean_ci(diffs, confidence), "diffs": diffs}


def ci_excludes_zero(summary: Mapping) -> bool:
    """True when the interval exists and lies wholly above or wholly below 0."""
    low, high = summary.get("ci_low"), summary.get("ci_high")
    return low is not None and high is not None and (low > 0 or high < 0)


def learned_counts(runs: Sequence[tuple[Mapping[str, Mapping], Mapping[str, Mapping]]]) -> dict[str, dict]:
    """`runs`: per node x seed run, (heldout_by_family at t = 0, heldout_by_family at the budget), each
    family -> {"pass1", "tasks", ...}. Returns family -> {"learned": runs that learned it, "runs": runs
    that evaluated it}: learned = pass@1 at the budget at least one task (1 / tasks) above t = 0."""
    out: dict[str, dict] = {}
    for start, end in runs:
        for family in sorted(set(start) & set(end)):
            tasks = end[family]["tasks"]
            gained = round((end[family]["pass1"] - start[family]["pass1"]) * tasks)  # tasks solved: an integer
            slot = out.setdefault(family, {"learned": 0, "runs": 0})
            slot["runs"] += 1
            slot["learned"] += int(gained >= 1)
    return dict(sorted(out.items()))


def format_interval(summary: Mapping, digits: int = 3) -> str:
    """'+0.043 [95% CI +0.012, +0.071] (n=8 seeds)', or the mean with 'CI n/a' and why."""
    if summary.get("mean") is None:
        return "n/a (no paired seeds)"
    mean = f"{summary['mean']:+.{digits}f}"
    seeds = f"n={summary['n']} seed{'' if summary['n'] == 1 else 's'}"
    if summary.get("ci_low") is None:
        return f"{mean} [CI {summary['note']}] ({seeds})"
    level = f"{summary['confidence']:.0%}"
    return f"{mean} [{level} CI {summary['ci_low']:+.{digits}f}, {summary['ci_high']:+.{digits}f}] ({seeds})"
