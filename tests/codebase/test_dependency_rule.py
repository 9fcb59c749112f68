"""The dependency rules, read from the source of every module (imports inside functions count too):

- node -> policy, node -> protocol; policy and protocol never import node or each other (the stdlib
  plumbing is policy/ground.py, which node/ imports too, and its twin protocol/ground.py: standard
  library only, tests/codebase/test_ground_twins.py holds them to one source);
- inside node/, the floors: a room imports only rooms on lower floors (FLOORS, lowest first);
- no import circle inside node/, policy/ or protocol/;
- every import inside a function in node/ says why it is there, in a comment beside it.
Each rule has its negative control: the same reader, shown an import that breaks the rule, says so."""
from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = {"policy": {"node", "protocol"}, "protocol": {"node", "policy"}}

# node/'s rooms, lowest floor first (node/'s stdlib plumbing is policy/ground.py's). observe and tasks
# import no room; the config is pure data (the runtime
# builds its objects from it: Verifier.from_config, IngestBudget.from_config); scoring reads its
# section; train runs rounds; peers verify and mix what others send, into train's groups; service
# assembles and runs a node (join, relay, the silo's exchange passed into Node), hostile peers send
# bad traffic beside it; testnet runs many nodes (with hostile ones), labs measure (with both);
# commands parse each verb's arguments and call those (node/commands/); cli dispatches to them.
# Rooms on one floor do not import each other.
FLOORS = [("observe", "tasks"), ("config",), ("scoring",), ("train",), ("peers",),
          ("service", "hostile"), ("testnet", "labs"), ("commands",), ("cli",)]
FLOOR_OF = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def layer_violations(layer: str, source: str) -> list[str]:
    """What `source`, a module of `layer` (policy or protocol), imports against the rule: node/ or the
    other layer."""
    return sorted(name for name in imported_names(source) if name.split(".")[0] in FORBIDDEN[layer])


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
    assert not broken, "dependency rule (node -> policy, node -> protocol only): " + "; ".join(broken)


def test_the_layer_rule_sees_node_and_the_other_layer():
    """The negative control: any module of node/ is node/; a layer's own ground is its own."""
    assert layer_violations("protocol", "from node.observe.metrics import MetricsLog") == [
        "node.observe.metrics.MetricsLog"]
    assert layer_violations("policy", "import node.service") == ["node.service"]
    assert layer_violations("protocol", "from node import cli, commands") == ["node.cli", "node.commands"]
    assert layer_violations("protocol", "from protocol.ground import die_with_parent") == []
    assert layer_violations("protocol", "from policy.ground import die_with_parent") == ["policy.ground.die_with_parent"]
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
    is not a circle: node/hostile/attacks.py names peer.py's HostilePeer that way)."""
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


# --- the floors of node/ --------------------------------------------------------------------------
def room_of(module: str) -> str | None:
    """node.config.schema -> config, node.cli -> cli; None for the node package itself."""
    parts = module.split(".")
    return parts[1] if parts[0] == "node" and len(parts) > 1 else None


def floor_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import a -> b in `graph` (module -> the node modules it imports) from a room to a room
    on the same floor or a higher one; a room missing from FLOORS is a violation too."""
    broken = []
    for module in sorted(graph):
        room = room_of(module)
        if room is not None and room not in FLOOR_OF:
            broken.append(f"{module}: room {room!r} is on no floor (add it to FLOORS)")
            continue
        for target in sorted(graph[module]):
            other = room_of(target)
            if room is None or other is None or other == room:
                continue
            if other not in FLOOR_OF or FLOOR_OF[other] >= FLOOR_OF[room]:
                broken.append(f"{module} -> {target} ({room} may import only floors below it)")
    return broken


def node_graph(root: Path = REPO) -> dict[str, set[str]]:
    """Every module of node/ under `root` -> the node modules it imports, type-only ones included
    (a type-only import is still a dependency of the text)."""
    graph = {}
    for path in (root / "node").rglob("*.py"):
        name = module_name(path, root)
        graph[name] = {m for m in imported_modules(path, root, runtime_only=False) if m.split(".")[0] == "node"}
    return graph


def test_every_room_of_node_imports_only_rooms_on_lower_floors():
    graph = node_graph()
    assert {room_of(m) for m in graph} - {None} == set(FLOOR_OF), "FLOORS names exactly node/'s rooms"
    assert not floor_violations(graph), "node/'s floors: " + "; ".join(floor_violations(graph))


@pytest.mark.parametrize("module, target", [
    ("node.config.schema", "node.scoring.verifiers.Verifier"),   # the four back arrows as they were
    ("node.config.swarm", "node.peers.ingest.IngestBudget"),
    ("node.scoring.sandbox", "node.service.child_env.child_env"),
    ("node.train.loop", "node.peers.self_replay.silo_exchange"),
    ("node.observe.metrics", "node.tasks.base"),                 # a room of the same floor
    ("node.observe.logs", "node.config.schema"),                 # the lowest floor above anything
    ("node.newroom.x", "node.tasks"),                            # a room no floor names
    ("node.hostile.peer", "node.testnet.plan"),                  # hostile peers never need the harness
    ("node.labs.nat_run", "node.testnet.memory"),                # nor the labs
    ("node.testnet.runner", "node.commands.testnet"),            # the harness never needs its verb
    ("node.service.join", "node.commands.common"),               # nor a service its command
])
def test_the_floor_rule_sees_an_upward_import(module, target):
    assert floor_violations({module: {target}}), f"{module} -> {target} passed"
    assert floor_violations({"node.cli": {target}}) == []  # the top floor may import it


def test_the_floor_rule_reads_a_lazy_upward_import_from_a_real_file(tmp_path):
    """The negative control on disk: a config module that imports the command line inside a function."""
    (tmp_path / "node" / "config").mkdir(parents=True)
    (tmp_path / "node" / "__init__.py").write_text("")
    (tmp_path / "node" / "config" / "__init__.py").write_text("")
    (tmp_path / "node" / "config" / "bad.py").write_text("def load():\n    from ..cli import main\n    return main\n")
    (tmp_path / "node" / "cli.py").write_text("from node.config.bad import load\n")
    assert floor_violations(node_graph(tmp_path)) == [
        "node.config.bad -> node.cli (config may import only floors below it)",
        "node.config.bad -> node.cli.main (config may import only floors below it)"]


def test_the_ground_imports_the_standard_library_only():
    found = {}
    for path in [REPO / "policy" / "ground.py", REPO / "protocol" / "ground.py"]:
        found[path.name] = {m for m in imported_modules(path, runtime_only=False)
                            if m.split(".")[0] not in sys.stdlib_module_names | {"__future__"}}
    assert found and not any(found.values()), found


# --- lazy imports ----------------------------------------------------------------------------------
# a tool's pragma is no reason: `# noqa: F401` alone is bare, `# noqa: F401 (the import takes 1 s)` is not
PRAGMA = re.compile(r"^(noqa|type:\s*ignore|pragma:?|pylint:|isort:)(:?\s*[\w-]+(,\s*[\w-]+)*)?")


def unexplained_lazy_imports(source: str) -> list[int]:
    """Lines of the imports inside functions of `source` that give no reason: a run of consecutive
    import statements in one body needs a comment (not a bare pragma such as `# noqa`) on one of its
    lines or on the line just above it."""
    reasons = {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
               if token.type == tokenize.COMMENT and PRAGMA.sub("", token.string.lstrip("#").strip()).strip(" -()")}
    missing = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for body in _bodies(function):
            for run in _import_runs(body):
                lines = range(run[0].lineno - 1, run[-1].end_lineno + 1)
                if not reasons.intersection(lines):
                    missing.append(run[0].lineno)
    return sorted(set(missing))


def _bodies(function: ast.AST):
    """Every statement list inside `function` (its body, an if's branches, a try's handlers...)."""
    for node in ast.walk(function):
        for field in ("body", "orelse", "finalbody", "handlers"):
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                yield value


def _import_runs(body: list[ast.stmt]) -> list[list[ast.stmt]]:
    runs, current = [], []
    for statement in body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            current.append(statement)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def test_every_lazy_import_in_node_says_why():
    missing = [f"{path.relative_to(REPO)}:{line}" for path in sorted((REPO / "node").rglob("*.py"))
               for line in unexplained_lazy_imports(path.read_text())]
    assert not missing, "an import inside a function needs its reason beside it: " + ", ".join(missing)


def test_the_lazy_import_rule_sees_a_bare_one():
    """The negative control: no comment, or only a pragma, is no reason; one comment serves a run."""
    assert unexplained_lazy_imports("def f():\n    import torch\n") == [2]
    assert unexplained_lazy_imports("def f():\n    import torch  # noqa: F401\n") == [2]
    assert unexplained_lazy_imports("def f():\n    import torch  # noqa: F401 (1 s: the worker's alone)\n") == []
    assert unexplained_lazy_imports("def f():\n    x = 1\n    import torch\n\n    import numpy\n") == [3]
    assert unexplained_lazy_imports("def f():\n    import torch  # 2 s: only the train command needs it\n"
                                     "    import numpy\n") == []
    assert unexplained_lazy_imports("def f():\n    # heavy: once the config is valid\n    import torch\n") == []
    assert unexplained_lazy_imports("import torch\nclass A:\n    def f(self):\n        if 1:\n"
                                    "            import numpy\n") == [5]
