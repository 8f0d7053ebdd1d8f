"""Importing a package runs none of its modules, and the typed rollout seam loads no store, ranker or model
library: each check imports in a fresh interpreter, where nothing is imported yet."""

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.parent.name for p in (ROOT / "kgreasoner").glob("*/__init__.py"))
HEAVY = ("torch", "torch_geometric", "transformers", "pyoxigraph", "SPARQLWrapper", "vllm")


def fresh_modules(code: str) -> list[str]:
    """`sys.modules` of a fresh interpreter after `code`, which runs from the repository root."""
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_rollout_types_load_no_kg_store_ranker_or_model_library():
    loaded = fresh_modules("import kgreasoner.rollout.types")
    assert "kgreasoner.rollout.types" in loaded
    assert [m for m in HEAVY if m in loaded] == []
    assert [m for m in loaded if m.startswith(("kgreasoner.retrieval", "kgreasoner.llm"))] == []
    assert [m for m in loaded if m.startswith("kgreasoner.kg.") and m != "kgreasoner.kg.base"] == []


def test_importing_the_package_runs_none_of_its_modules():
    assert [m for m in fresh_modules("import kgreasoner") if m.startswith("kgreasoner")] == ["kgreasoner"]


def test_importing_a_package_runs_none_of_its_modules():
    code = "\n".join(
        [
            "import sys",
            "ran = {}",
            *(
                f"import kgreasoner.{p}; ran[{p!r}] = [m for m in sys.modules if m.startswith('kgreasoner.{p}.')]"
                for p in PACKAGES
            ),
            "import json; print(json.dumps(ran))",
        ]
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    ran = json.loads(out.strip().splitlines()[-1])
    assert {"kg", "records", "rollout"} <= set(ran)
    assert {p: modules for p, modules in ran.items() if modules} == {}


def lazy_tables() -> dict[str, tuple[dict[str, str], dict[str, str], list[str]]]:
    """package -> (the exports table, the names its TYPE_CHECKING block imports with their modules, `__all__`)
    of every package `__init__` that exports names on first use."""
    found = {}
    for package in PACKAGES:
        tree = ast.parse((ROOT / "kgreasoner" / package / "__init__.py").read_text(encoding="utf-8"))
        guarded = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
        if not guarded:
            continue
        typed = {a.name: n.module for n in guarded[0].body if isinstance(n, ast.ImportFrom) for a in n.names}
        call = next(n for n in ast.walk(guarded[0]) if isinstance(n, ast.Call) and ast.unparse(n.func) == "exports")
        table = ast.literal_eval(call.args[1])
        names = next(
            ast.literal_eval(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__all__"
        )
        found[f"kgreasoner.{package}"] = (table, typed, names)
    return found


def test_lazy_exports_name_what_their_typed_imports_name():
    tables = lazy_tables()
    assert sorted(tables) == ["kgreasoner.data", "kgreasoner.kg", "kgreasoner.llm", "kgreasoner.rollout"]
    for package, (table, typed, names) in tables.items():
        assert table == typed, package
        assert sorted(names) == sorted(table), package


@pytest.mark.parametrize("package", ["kgreasoner.data", "kgreasoner.kg", "kgreasoner.llm", "kgreasoner.rollout"])
def test_a_lazy_export_is_its_modules_object(package):
    table, _, _ = lazy_tables()[package]
    module = importlib.import_module(package)
    for name, source in table.items():
        assert getattr(module, name) is getattr(importlib.import_module(source), name)
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'nothing_here'"):
        module.nothing_here  # noqa: B018
