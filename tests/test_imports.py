"""Imports one way (the layering and the cycles are `lint-imports`'s, in pyproject.toml): no module imports
another module's underscore names, and a function-local import says why it is not at the top (a comment
on its line, or on the first local import line of its function: keeping `specblock --help` or an
optional dependency light, or a bare GPU machine's imports)."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

from core.paths import REPO

PACKAGES = ("core", "policies", "simulator", "real_engine", "experiments", "benchmarks")
Function = ast.FunctionDef | ast.AsyncFunctionDef
Import = ast.Import | ast.ImportFrom


def private(name: str) -> bool:
    """An underscore name, not a dunder (``__version__``)."""
    return name.startswith("_") and not name.endswith("__")


def local_imports(tree: ast.Module) -> dict[Function, list[Import]]:
    """Each function's own import statements (not its nested functions'), in line order."""
    out: dict[Function, list[Import]] = {}

    def visit(node: ast.AST, function: Function | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, Import) and function is not None:
                out.setdefault(function, []).append(child)
            visit(child, child if isinstance(child, Function) else function)

    visit(tree, None)
    return {f: sorted(imports, key=lambda i: i.lineno) for f, imports in out.items()}


def problems(source: str, name: str = "<source>") -> list[str]:
    """What breaks the two rules in ``source``, one line each (``name:line what``)."""
    tree = ast.parse(source)
    commented = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                 if tok.type == tokenize.COMMENT}
    found = []
    for node in ast.walk(tree):
        modules = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                   else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
        bad = [n for n in names if private(n)]
        bad += [m for m in modules if m.split(".")[0] in PACKAGES and any(map(private, m.split(".")))]
        if bad:
            found.append(f"{name}:{node.lineno} imports another module's underscore name {', '.join(bad)}")

    def says_why(statement: Import) -> bool:
        return any(line in commented for line in range(statement.lineno, statement.end_lineno + 1))

    for function, imports in local_imports(tree).items():
        if says_why(imports[0]):
            continue
        for statement in imports:
            if not says_why(statement):
                found.append(f"{name}:{statement.lineno} a local import in {function.name}() without its "
                             "reason: move it to the top, or say why on its function's first local import")
    return found


def modules() -> list[Path]:
    """Every module of the packages."""
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def test_every_module_imports_one_way() -> None:
    assert len(modules()) > 50
    found = [p for path in modules() for p in problems(path.read_text(), str(path.relative_to(REPO)))]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(("source", "count"), [
    ("from core.files import _capped\n", 1),
    ("from experiments import _private as ok\n", 1),
    ("import experiments._hidden\n", 1),
    ("from core.files import __doc__, write_json\n", 0),
    ("def f():\n    import torch\n    return torch\n", 1),
    ("def f():\n    import torch\n\n    from real_engine.model import Transformer\n", 2),
    ("def f():\n    import torch  # heavy: not for --help\n\n    from real_engine import model\n", 0),
    ("def f():\n    from x import (  # optional\n        a,\n    )\n    import y\n", 0),
    ("def f():\n    import torch\n    import numpy  # why\n", 1),
    ("def f():\n    import torch  # why\n\n    def g():\n        import numpy\n", 1),
    ("def f():\n    s = '# not a comment'; import torch\n", 1),
    ("import torch\n\nif True:\n    import numpy\n", 0),
])
def test_the_checker_finds_each_problem(source: str, count: int) -> None:
    assert len(problems(source)) == count, problems(source)
