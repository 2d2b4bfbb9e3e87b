"""The static checks cover what the README claims: mypy's file list and strictness, and every definition in the
checked packages annotated (what `disallow_untyped_defs` / `disallow_incomplete_defs` demand), read from the
source so a loosened config or an `ignore_errors` override cannot hide an untyped boundary. CI runs mypy itself
(`.ci/run`); this test is the cheap guard that the claim stays true.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ["tuner/__init__.py", "tuner/__main__.py", "tuner/cli.py", "tuner/core", "tuner/tuning", "tuner/backends",
           "tuner/profiles", "tuner/actions", "tuner/helper", "tuner/commands", "tuner/app", "tuner/screens",
           "tuner/widgets", "tuner/engine"]
STRICT_FLAGS = ("disallow_untyped_defs", "disallow_incomplete_defs", "check_untyped_defs", "no_implicit_optional",
                "warn_unused_ignores")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _untyped(tree: ast.Module) -> tuple[int, list[str]]:
    """(definitions, the ones missing an annotation) under mypy's rule: every parameter but a method's first,
    and the return (an `__init__` with annotated parameters may leave it out)."""
    count, missing = 0, []

    def visit(node: ast.AST, in_class: bool) -> None:
        nonlocal count
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                count += 1
                a = child.args
                params = [*a.posonlyargs, *a.args]
                static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in child.decorator_list)
                if in_class and not static and params:
                    params = params[1:]  # self / cls
                params += [*a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p is not None)]
                bare = [p.arg for p in params if p.annotation is None]
                no_return = child.returns is None and not (child.name == "__init__" and params and not bare)
                if bare or no_return:
                    missing.append(f"{child.name} (line {child.lineno})")
                visit(child, in_class=False)
            elif isinstance(child, ast.ClassDef):
                visit(child, in_class=True)
            else:
                visit(child, in_class=in_class)

    visit(tree, in_class=False)
    return count, missing


def test_mypy_checks_the_whole_package_strictly():
    mypy = _pyproject()["tool"]["mypy"]
    assert sorted(mypy["files"]) == sorted(CHECKED)
    # every package and module of tuner/ is in the list (a new one is checked the day it is written), the engine
    # included since issue 21 item 7 (torch's stubs)
    top = {str(p.relative_to(ROOT)) for p in (ROOT / "tuner").iterdir()
           if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert top == set(CHECKED)
    for flag in STRICT_FLAGS:
        assert mypy.get(flag) is True, flag
    for override in mypy.get("overrides", []):  # only missing vendor stubs may be excused, never our own code
        assert not override.get("ignore_errors"), override
        assert not any(str(m).startswith("tuner") for m in override["module"]), override


def test_every_definition_in_the_checked_packages_is_annotated():
    modules = definitions = 0
    missing = []
    for package in CHECKED:
        root = ROOT / package
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            modules += 1
            count, bare = _untyped(ast.parse(path.read_text(), str(path)))
            definitions += count
            missing += [f"{path.relative_to(ROOT)}: {name}" for name in bare]
    assert not missing, "untyped definitions:\n" + "\n".join(missing)
    assert modules >= 40 and definitions >= 500  # the packages were found (a wrong path checks nothing)
    print(f"mypy coverage: {modules} modules, {definitions} definitions, all annotated")


def test_ci_runs_the_readme_command_then_every_static_check():
    lines = [ln for ln in (ROOT / ".ci/run").read_text().splitlines() if ln and not ln.startswith(("#", "set "))]
    commands = [ln for ln in lines if not ln.startswith("cd ")]
    assert commands[0].startswith("bash scripts/setup.sh --test && .venv/bin/python -m pytest")
    assert commands[1:] == [".venv/bin/ruff check .", ".venv/bin/mypy", ".venv/bin/lint-imports"]


def _contract(contract_id: str) -> dict:
    return next(c for c in _pyproject()["tool"]["importlinter"]["contracts"] if c.get("id") == contract_id)


def test_the_layers_contract_is_the_architecture_table_row_by_row():
    """docs/architecture.md's table and the `layers` contract name the same packages, and every package of tuner/
    has a row: a package the table adds without a contract row (or the other way) fails here, not in review."""
    layers = _contract("layers")
    assert layers["type"] == "layers" and layers["containers"] == ["tuner"] and layers["exhaustive"] is True
    in_contract = {name.strip() for row in layers["layers"] for name in row.replace("|", ":").split(":")}
    table = (ROOT / "docs/architecture.md").read_text()
    in_table = {cell.strip("`/").removeprefix("tuner/").removesuffix(".py")
                for line in table.splitlines() if line.startswith("| `tuner/")
                for cell in line.split("|")[1].replace(",", " ").split()}
    on_disk = {p.name for p in (ROOT / "tuner").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    on_disk |= {p.stem for p in (ROOT / "tuner").glob("*.py") if p.stem != "__init__"}
    assert in_table == on_disk - {"__main__"}, "docs/architecture.md's rows vs tuner/"
    assert in_contract == on_disk, "the layers contract vs tuner/"


def test_the_front_ends_reach_the_safety_files_and_the_store_only_through_actions():
    front = _contract("front-ends")
    assert front["type"] == "forbidden" and front["as_packages"] is False
    for package in ("commands", "app", "screens", "widgets"):
        assert {f"tuner.{package}", f"tuner.{package}.**"} <= set(front["source_modules"]), package
    assert {"tuner.tuning.journal", "tuner.profiles", "tuner.profiles.store"} <= set(front["forbidden_modules"])
