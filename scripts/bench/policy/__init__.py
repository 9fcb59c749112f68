"""The policy benchmark (`python -m scripts.bench.policy.bench`): generation (1), training against
TRL (2), rss (3, a fresh process per memory configuration), report (table and plot)."""
