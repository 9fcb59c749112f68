"""The dependency rules, read from the source of every module (imports inside functions count too):

- node -> policy, node -> protocol; policy and protocol never import node or each other, but the
  ground floor node/ground/, which all may import and which imports only the standard library;
- no import circle inside node/, policy/ or protocol/;
Each rule has its negative control: the same reader, shown an import that breaks the rule, says so."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GROUND = "node.ground"
FORBIDDEN = {"policy": {"node", "protocol"}, "protocol": {"node", "policy"}}


def layer_violations(layer: str, source: str) -> list[str]:
    """What `source`, a module of `layer` (policy or protocol), imports against the rule: node/ (but
    its ground floor) or the other layer."""
    return sorted(name for name in imported_names(source) if name.split(".")[0] in FORBIDDEN[layer]
                  and not (name == GROUND or name.startswith(GROUND + ".")))


def imported_names(source: str) -> set[str]:
    """Dotted names that `source` imports by absolute name, wherever the import stands (type-only
    ones included): `from a.b import c` yields a.b.c."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_policy_and_protocol_never_import_node_or_each_other():
    broken = []
    for layer in FORBIDDEN:
        files = sorted((REPO / layer).rglob("*.py"))
        assert len(files) > 5, f"no modules found under {layer}/"
        for path in files:
            broken += [f"{path.relative_to(REPO)} imports {name}" for name in layer_violations(layer, path.read_text())]
    assert not broken, "dependency rule (node -> policy, node -> protocol only; node.ground for all): " + "; ".join(broken)


def test_the_layer_rule_sees_node_but_lets_the_ground_through():
    """The negative control: node.groundless is not the ground; node.ground.files is."""
    assert layer_violations("protocol", "from node.ground.files import atomic_write_bytes") == []
    assert layer_violations("policy", "import node.ground.parent_death") == []
    assert layer_violations("protocol", "from node.groundless import x\nfrom node import cli, ground") == [
        "node.cli", "node.groundless.x"]
    assert layer_violations("policy", "def f():\n    from protocol.files import atomic_write_bytes") == [
        "protocol.files.atomic_write_bytes"]


def test_the_reader_sees_every_form_of_import():
    """The negative control: each way of writing an import is seen (relative ones stay in their package)."""
    assert imported_names("import node.loop") == {"node.loop"}
    assert imported_names("from node import cli") == {"node.cli"}
    assert imported_names("import torch, protocol.kinds as kinds") == {"torch", "protocol.kinds"}
    assert imported_names("def f():\n    if True:\n        from policy.losses import make_objective") == {
        "policy.losses.make_objective"}
    assert imported_names("from .files import atomic_write_bytes\nfrom ..identity import x") == set()


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` but those under `if TYPE_CHECKING:`, which never run (a type-only import
    is not a circle: node/testnet/hostile_attacks.py names hostile.py's HostilePeer that way)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            todo += node.orelse
            continue
        todo += ast.iter_child_nodes(node)


def imported_modules(path: Path, root: Path = REPO, runtime_only: bool = True) -> set[str]:
    """Dotted names that the module at `path` imports (relative ones resolved), wherever the import
    stands (but under `if TYPE_CHECKING:` with runtime_only); `from a import b` yields both `a` and
    `a.b` (b may be a submodule)."""
    name, package = module_name(path, root), path.name == "__init__.py"
    found = set()
    tree = ast.parse(path.read_text())
    for node in _runtime_nodes(tree) if runtime_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = name.split(".") if package else name.split(".")[:-1]
                module = ".".join(base[: len(base) - node.level + 1] + ([module] if module else []))
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every edge a -> b that lies on a cycle (b reaches a back)."""
    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    return [f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a]) if a in reachable(b)]


def test_no_import_circles_inside_node_policy_or_protocol():
    """Lazy imports inside functions count: a circle hidden in a function is still a circle. A
    module importing its own package (whose __init__ runs first anyway) is not an edge."""
    for layer in ("node", *FORBIDDEN):
        paths = {module_name(p): p for p in (REPO / layer).rglob("*.py")}
        graph = {name: {m for m in imported_modules(path) if m in paths and m != name
                        and not name.startswith(m + ".")}
                 for name, path in paths.items()}
        assert not import_cycles(graph), f"import circle in {layer}/: " + "; ".join(import_cycles(graph))


def test_the_circle_finder_sees_a_lazy_circle():
    """The negative control: policy.generation <-> policy.vllm_backend, as it once was."""
    graph = {"policy.generation": {"policy.vllm_backend"}, "policy.vllm_backend": {"policy.generation"},
             "policy.backends": {"policy.generation", "policy.vllm_backend"}}
    assert import_cycles(graph) == ["policy.generation -> policy.vllm_backend",
                                    "policy.vllm_backend -> policy.generation"]
    graph["policy.generation"] = set()
    assert import_cycles(graph) == []


def test_a_type_only_import_is_not_an_edge(tmp_path):
    """Negative control of the TYPE_CHECKING rule: the same import outside the block is seen."""
    hidden = tmp_path / "hidden.py"
    hidden.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from node.cli import main\n")
    seen = tmp_path / "seen.py"
    seen.write_text("import typing\nif not typing.TYPE_CHECKING:\n    from node.cli import main\n")
    runtime = {n.module for n in _runtime_nodes(ast.parse(hidden.read_text())) if isinstance(n, ast.ImportFrom)}
    assert runtime == {"typing"}
    runtime = {n.module for n in _runtime_nodes(ast.parse(seen.read_text())) if isinstance(n, ast.ImportFrom)}
    assert runtime == {"node.cli"}

