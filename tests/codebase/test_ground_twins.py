"""policy/ground.py and protocol/ground.py are twins: protocol/ may import neither node/ nor policy/
(tests/codebase/test_dependency_rule.py), so it keeps its own copy of the plumbing it needs. Each
function and constant both define must have the same source (compared as syntax trees), so a fix in
one can never miss the other; node/ imports policy's and has no copy of its own."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TWINS = (REPO / "policy" / "ground.py", REPO / "protocol" / "ground.py")


def definitions(source: str) -> dict[str, str]:
    """Top-level functions and constant assignments of a module, by name, as syntax-tree dumps."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = ast.dump(node)
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            for target in node.targets:
                found[target.id] = ast.dump(node.value)
    return found


def differing(a: str, b: str) -> list[str]:
    first, second = definitions(a), definitions(b)
    return sorted(name for name in first.keys() & second.keys() if first[name] != second[name])


def test_the_twins_share_their_plumbing_and_it_is_the_same_source():
    policy, protocol = (definitions(path.read_text()) for path in TWINS)
    shared = policy.keys() & protocol.keys()
    assert {"atomic_write_bytes", "fsync_dir", "die_with_parent", "FILE_MODE"} <= shared, sorted(shared)
    assert differing(*(path.read_text() for path in TWINS)) == []


def test_a_twin_that_drifted_is_named():
    """The negative control: one changed line in one twin is found, by name."""
    source = TWINS[0].read_text()
    drifted = source.replace("os.fsync(fd)", "pass", 1)
    assert drifted != source and differing(source, drifted) == ["fsync_dir"]
