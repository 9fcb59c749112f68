"""The dependency rule, read from the source of every module: node -> policy, node -> protocol;
policy and protocol never import node or each other (imports inside functions count too)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {"policy": {"node", "protocol"}, "protocol": {"node", "policy"}}


def imported_packages(source: str) -> set[str]:
    """Top-level packages that `source` imports by absolute name, wherever the import stands.
    Relative imports are left out: Python keeps them inside the importing module's package."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_policy_and_protocol_never_import_node_or_each_other():
    broken = []
    for layer, forbidden in FORBIDDEN.items():
        files = sorted((REPO / layer).rglob("*.py"))
        assert len(files) > 5, f"no modules found under {layer}/"
        for path in files:
            bad = imported_packages(path.read_text()) & forbidden
            broken += [f"{path.relative_to(REPO)} imports {name}" for name in sorted(bad)]
    assert not broken, "dependency rule (node -> policy, node -> protocol only): " + "; ".join(broken)


def test_the_reader_sees_every_form_of_import():
    """The negative control: each way of writing an import is seen."""
    assert imported_packages("import node.loop") == {"node"}
    assert imported_packages("from node import cli") == {"node"}
    assert imported_packages("import torch, protocol.kinds as kinds") == {"torch", "protocol"}
    assert imported_packages("def f():\n    if True:\n        from policy.losses import make_objective") == {"policy"}
    assert imported_packages("from .files import atomic_write_bytes\nfrom ..identity import x") == set()
