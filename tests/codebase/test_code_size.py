"""The house rules on size, checked over every package module: no module over 500 lines and no
function over 60, so a module stays readable top to bottom (README "Layout").

scripts/ (every .py under it) follows a looser rule: modules of at most 500 lines, functions of at most
80. A script is an experiment driver read top to bottom, one stage after another (set the run up,
run it, tabulate, plot), and a stage split below 80 lines only to meet the packages' 60 would scatter
one measurement over helpers that serve nothing else; past 80 a function holds more than one stage."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("node", "protocol", "policy")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
SCRIPT_MAX_MODULE_LINES = 500
SCRIPT_MAX_FUNCTION_LINES = 80


def package_modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "_generated" not in p.parts)


def script_modules() -> list[Path]:
    return sorted((ROOT / "scripts").rglob("*.py"))


def long_functions(path: Path, limit: int, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.relative_to(root)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


def long_modules(modules: list[Path], limit: int) -> list[str]:
    return [f"{p.relative_to(ROOT)} ({n} lines)" for p in modules if (n := len(p.read_text().splitlines())) > limit]


def test_no_package_module_is_over_500_lines():
    modules = package_modules()
    assert len(modules) > 50  # the walk found the packages
    too_long = long_modules(modules, MAX_MODULE_LINES)
    assert not too_long, f"split these modules (at most {MAX_MODULE_LINES} lines): {too_long}"


def test_no_package_function_is_over_60_lines():
    too_long = [f for p in package_modules() for f in long_functions(p, MAX_FUNCTION_LINES)]
    assert not too_long, f"split these functions (at most {MAX_FUNCTION_LINES} lines): {too_long}"


def test_no_script_module_is_over_500_lines():
    modules = script_modules()
    assert len(modules) > 25  # the walk found the scripts
    too_long = long_modules(modules, SCRIPT_MAX_MODULE_LINES)
    assert not too_long, f"split these scripts (at most {SCRIPT_MAX_MODULE_LINES} lines): {too_long}"


def test_no_script_function_is_over_80_lines():
    too_long = [f for p in script_modules() for f in long_functions(p, SCRIPT_MAX_FUNCTION_LINES)]
    assert not too_long, f"split these functions (at most {SCRIPT_MAX_FUNCTION_LINES} lines): {too_long}"


def test_the_checker_sees_a_long_function(tmp_path):
    """Negative control: a 61-line function is reported."""
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    sample = tmp_path / "probe.py"
    sample.write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    assert long_functions(sample, MAX_FUNCTION_LINES, tmp_path) == ["probe.py:5 long (61 lines)"]
