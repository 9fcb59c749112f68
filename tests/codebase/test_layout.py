"""The suite's layout (tests/__init__.py): every test file sits in one of the layout's folders, never at
tests/'s top level or in a folder of its own; helpers live in tests/support/; every folder is a package,
so that one test module importing another gets the module pytest collected, not a second copy."""
from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
LAYOUT = {"codebase", "experiments", "support",
          *(f"unit/{room}" for room in ("config", "ground", "observe", "peers", "policy", "protocol",
                                        "scoring", "testnet", "train")),
          *(f"integration/{room}" for room in ("deploy", "node", "policy", "protocol"))}
PACKAGE_ONLY = {"unit", "integration"}  # folders that hold only the folders above
SUPPORT_DATA = ("support/warm_site",)  # not a package: the folder put on the children's PYTHONPATH


def misplaced(paths: list[str]) -> list[str]:
    """The files among `paths` (relative to tests/, POSIX) that break the layout, each with why."""
    problems = []
    for path in paths:
        folder, _, name = path.rpartition("/")
        if folder.startswith(SUPPORT_DATA) or (name in ("__init__.py", "conftest.py")
                                               and folder in {"", *LAYOUT, *PACKAGE_ONLY}):
            continue
        if folder not in LAYOUT:
            problems.append(f"{path}: not in a layout folder")
        elif name.startswith("test_") != (folder != "support"):
            problems.append(f"{path}: tests go in the test folders, helpers in support/")
    return problems


def python_files() -> list[str]:
    return sorted(p.relative_to(TESTS).as_posix() for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_test_file_sits_in_a_layout_folder_and_every_helper_in_support():
    files = python_files()
    assert sum(name.startswith("test_") for name in (Path(f).name for f in files)) > 100  # the walk saw the suite
    assert misplaced(files) == []


def test_a_file_at_the_top_or_in_a_folder_outside_the_layout_is_reported():
    assert misplaced(["test_x.py", "misc/test_y.py", "unit/test_z.py", "unit/peers/helper.py",
                      "support/test_w.py", "unit/peers/test_ok.py", "support/waiting.py"]) == [
        f"{path}: {why}" for path, why in [
            ("test_x.py", "not in a layout folder"), ("misc/test_y.py", "not in a layout folder"),
            ("unit/test_z.py", "not in a layout folder"),
            ("unit/peers/helper.py", "tests go in the test folders, helpers in support/"),
            ("support/test_w.py", "tests go in the test folders, helpers in support/")]]


def test_every_layout_folder_is_a_package_and_exists():
    for folder in ["", *sorted(LAYOUT), *sorted(PACKAGE_ONLY)]:
        assert (TESTS / folder / "__init__.py").is_file(), f"tests/{folder} needs an __init__.py"
