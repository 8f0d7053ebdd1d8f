"""Imports run one way: every module under kgreasoner/ and data_gen/ imports only from its own
layer unit or from layers below it, and no modules import each other in a cycle.

A layer unit is a folder: each package under kgreasoner/ is one (every module in it, its
sub-folders included), each module at kgreasoner/'s top is one of its own, and data_gen is one.
The layers, bottom first (units on one line are peers, which must not import each other):

 1. foundations  kgreasoner.records (the records, their readers, the id vocabulary, the HTTP client),
                 kgreasoner.config, kgreasoner.terminal, kgreasoner.lazy, and kgreasoner's own __init__
 2. protocol     kgreasoner.protocol: the tags, the query and listing grammar, ToolResult
 3. kg           kgreasoner.kg: the stores (memory, oxigraph, SPARQL, RoG subgraphs) and their commands
 4. datasets     kgreasoner.data: a dataset comes with its KB, and these open it and search relation
                 paths over it
 5. tool, engine kgreasoner.retrieval (the search tool, its ranker and the ranker's training) |
                 kgreasoner.rollout (the engine and its generation backends): the engine knows a
                 search session only through protocol and rollout.types
 6. tokenizer    kgreasoner.tokenizer
 7. models       kgreasoner.models (it trains its tokenizer)
 8. llm          kgreasoner.llm: clients and the backend factory over rollout's backends and models
 9. rewards      kgreasoner.rewards
10. methods      kgreasoner.training | kgreasoner.baselines
11. evaluation   kgreasoner.evaluation: the harness runs baselines and our model
12. jobs         kgreasoner.serving | data_gen (data_gen scores its pipelines with evaluation's metrics)
13. stages       kgreasoner.stages | kgreasoner.demo_report
14. demo         kgreasoner.demo
15. ablate       kgreasoner.ablate: variants of the demo's stages
16. cli          kgreasoner.cli

An import inside a function or under `if TYPE_CHECKING` counts like one at the top of the file.
`from a.b import c` imports the module `a.b.c` when there is one, else `a.b`; a package's
`__init__` is a module of its own (importing `a.b.c` runs it too, but no `__init__` here imports
anything when it runs: its exports load on first use, `kgreasoner.lazy`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("kgreasoner", "data_gen")

LAYERS: list[list[str]] = [
    ["kgreasoner.records", "kgreasoner.config", "kgreasoner.terminal", "kgreasoner.lazy", "kgreasoner"],
    ["kgreasoner.protocol"],
    ["kgreasoner.kg"],
    ["kgreasoner.data"],
    ["kgreasoner.retrieval", "kgreasoner.rollout"],
    ["kgreasoner.tokenizer"],
    ["kgreasoner.models"],
    ["kgreasoner.llm"],
    ["kgreasoner.rewards"],
    ["kgreasoner.training", "kgreasoner.baselines"],
    ["kgreasoner.evaluation"],
    ["kgreasoner.serving", "data_gen"],
    ["kgreasoner.stages", "kgreasoner.demo_report"],
    ["kgreasoner.demo"],
    ["kgreasoner.ablate"],
    ["kgreasoner.cli"],
]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for top in SOURCES for p in (root / top).rglob("*.py"))


def unit(module: str, root: Path = ROOT) -> str:
    """The folder a module belongs to: its package under kgreasoner/, itself at kgreasoner/'s top, or data_gen."""
    parts = module.split(".")
    if parts[0] != "kgreasoner":
        return parts[0]
    if len(parts) > 1 and (root / "kgreasoner" / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module


def place(module: str, root: Path = ROOT) -> tuple[int, str] | None:
    """(layer index, unit) of the module's unit; None when LAYERS does not name it."""
    here = unit(module, root)
    return next(((i, here) for i, layer in enumerate(LAYERS) if here in layer), None)


def imports_of(path: Path, modules: set[str], root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, imported module) for every import of a module under SOURCES, wherever it sits."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
        else:
            continue
        for target in dict.fromkeys(targets):
            if target.split(".")[0] in SOURCES:
                found.append((node.lineno, target))
    return found


def import_graph(root: Path = ROOT) -> dict[str, list[tuple[Path, int, str]]]:
    """module -> [(file, line, imported module)] over every module under SOURCES."""
    files = source_files(root)
    modules = {module_name(p, root) for p in files}
    return {module_name(p, root): [(p, line, t) for line, t in imports_of(p, modules, root)] for p in files}


def upward_imports(graph: dict[str, list[tuple[Path, int, str]]], root: Path = ROOT) -> list[str]:
    problems = []
    for module, edges in graph.items():
        here = place(module, root)
        if here is None:
            problems.append(f"{module}: in no layer (add {unit(module, root)} to LAYERS in tests/test_layering.py)")
            continue
        for path, line, target in edges:
            there = place(target, root)
            if there is None or there == here or there[0] < here[0]:
                continue
            where = f"{path.relative_to(root)}:{line}: {module} imports {target}"
            if there[0] > here[0]:
                problems.append(f"{where}, a layer above it ({there[1]} over {here[1]})")
            else:
                problems.append(f"{where}, a peer in its own layer ({there[1]} beside {here[1]})")
    return problems


def import_cycles(graph: dict[str, list[tuple[Path, int, str]]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    edges = {m: sorted({t for _, _, t in e if t in graph and t != m}) for m, e in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return cycles


def describe_cycle(cycle: list[str], graph: dict[str, list[tuple[Path, int, str]]], root: Path = ROOT) -> str:
    members = set(cycle)
    lines = [
        f"{p.relative_to(root)}:{line}: {m} imports {t}"
        for m in cycle
        for p, line, t in graph[m]
        if t in members and t != m
    ]
    return "import cycle among " + ", ".join(cycle) + ":\n    " + "\n    ".join(lines)


def test_every_import_runs_down_the_layers():
    problems = upward_imports(import_graph())
    assert not problems, "imports against the layering:\n" + "\n".join(problems)


def test_no_import_cycles():
    graph = import_graph()
    cycles = import_cycles(graph)
    assert not cycles, "\n".join(describe_cycle(c, graph) for c in cycles)


def test_no_module_imports_another_modules_private_names():
    private = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {', '.join(a.name for a in node.names if a.name.startswith('_'))} "
        f"from {node.module}"
        for path in source_files()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.split(".")[0] in SOURCES
        and any(a.name.startswith("_") and a.name != "__version__" for a in node.names)
    ]
    assert not private, "private names imported from another module:\n" + "\n".join(private)


def test_the_layer_table_names_every_folder_once():
    units = {unit(module_name(p)) for p in source_files()}
    named = [entry for layer in LAYERS for entry in layer]
    assert sorted(named) == sorted(units)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_an_upward_lazy_import_is_named_with_its_file_and_line(tmp_path):
    root = _tree(
        tmp_path,
        {
            "kgreasoner/__init__.py": "",
            "kgreasoner/kg/__init__.py": "",
            "kgreasoner/kg/memory.py": "import os\n\ndef f():\n    from kgreasoner.retrieval import tool\n",
            "kgreasoner/retrieval/__init__.py": "",
            "kgreasoner/retrieval/tool.py": "from ..kg import memory\n",
            "data_gen/__init__.py": "",
        },
    )
    problems = upward_imports(import_graph(root), root)
    assert problems == [
        "kgreasoner/kg/memory.py:4: kgreasoner.kg.memory imports kgreasoner.retrieval.tool, "
        "a layer above it (kgreasoner.retrieval over kgreasoner.kg)"
    ]


def test_a_module_belongs_to_its_folder_whatever_its_name(tmp_path):
    root = _tree(
        tmp_path,
        {
            "kgreasoner/__init__.py": "",
            "kgreasoner/records/__init__.py": "",
            "kgreasoner/records/schema.py": "from kgreasoner.kg.base import KnowledgeGraph\n",
            "kgreasoner/kg/__init__.py": "",
            "kgreasoner/kg/base.py": "",
            "kgreasoner/extras/__init__.py": "",
            "data_gen/__init__.py": "",
        },
    )
    assert upward_imports(import_graph(root), root) == [
        "kgreasoner.extras: in no layer (add kgreasoner.extras to LAYERS in tests/test_layering.py)",
        "kgreasoner/records/schema.py:1: kgreasoner.records.schema imports kgreasoner.kg.base, "
        "a layer above it (kgreasoner.kg over kgreasoner.records)",
    ]


def test_peers_must_not_import_each_other(tmp_path):
    root = _tree(
        tmp_path,
        {
            "kgreasoner/__init__.py": "",
            "kgreasoner/training/__init__.py": "",
            "kgreasoner/training/sft.py": "from kgreasoner.baselines.io import IOMethod\n",
            "kgreasoner/baselines/__init__.py": "",
            "kgreasoner/baselines/io.py": "",
            "data_gen/__init__.py": "",
        },
    )
    assert upward_imports(import_graph(root), root) == [
        "kgreasoner/training/sft.py:1: kgreasoner.training.sft imports kgreasoner.baselines.io, "
        "a peer in its own layer (kgreasoner.baselines beside kgreasoner.training)"
    ]


def test_a_cycle_inside_one_layer_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "kgreasoner/__init__.py": "",
            "kgreasoner/demo.py": "import kgreasoner.cli\n",
            "kgreasoner/cli.py": "def main():\n    from kgreasoner import demo\n",
            "data_gen/__init__.py": "",
        },
    )
    graph = import_graph(root)
    assert import_cycles(graph) == [["kgreasoner.cli", "kgreasoner.demo"]]
    assert describe_cycle(["kgreasoner.cli", "kgreasoner.demo"], graph, root) == (
        "import cycle among kgreasoner.cli, kgreasoner.demo:\n"
        "    kgreasoner/cli.py:2: kgreasoner.cli imports kgreasoner.demo\n"
        "    kgreasoner/demo.py:1: kgreasoner.demo imports kgreasoner.cli"
    )


@pytest.mark.parametrize(
    "module, layer",
    [
        ("kgreasoner.records.normalize", 0),
        ("kgreasoner.records.http", 0),
        ("kgreasoner", 0),
        ("kgreasoner.protocol", 1),
        ("kgreasoner.kg.base", 2),
        ("kgreasoner.kg.memory", 2),
        ("kgreasoner.data", 3),
        ("kgreasoner.data.datasets", 3),
        ("kgreasoner.rollout.types", 4),
        ("kgreasoner.tokenizer", 5),
        ("kgreasoner.llm.clients", 7),
        ("kgreasoner.rewards", 8),
        ("data_gen.warmup.writer", 11),
        ("kgreasoner.cli", 15),
    ],
)
def test_modules_land_in_their_folders_layer(module, layer):
    assert place(module)[0] == layer
