"""Experiments, one module each (`python -m scripts.experiments.<name> --quick` for a smoke run):
the claims in docs/ (testnets-and-experiments.md "Experiments" and the pages it links) and
policy/ALGORITHMS.md come from them."""
