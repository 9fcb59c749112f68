"""Experiments, one module each (`python -m scripts.experiments.<name> --quick` for a smoke run):
the claims in the README and policy/ALGORITHMS.md come from them."""
