"""Source of an import hook that makes the named top-level packages absent (importlib.util.find_spec
raises ModuleNotFoundError, as a plain import does): run it first in a child interpreter, or write it
as its sitecustomize.py, to simulate an environment without them."""
from __future__ import annotations


def hiding_source(names: tuple[str, ...]) -> str:
    return f"""
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {tuple(names)!r}:
            raise ModuleNotFoundError(f'No module named {{name!r}}', name=name)
        return None
sys.meta_path.insert(0, Absent())
"""
