"""Imports run one way: every module under kgreasoner/ and data_gen/ imports only from its own
layer unit or from layers below it, and no modules import each other in a cycle.

The layers, bottom first (a module belongs to the longest entry that names it or a package above
it; entries on one line are peers, which must not import each other):

 1. records      kgreasoner (the package root), kgreasoner.config, kgreasoner.protocol;
                 kgreasoner.data.s record modules: schema, trajectories, normalize, paths, splits, sampling and
                 the readers of each published format (pathquestion, tog_json, webqsp_cwq, rog, and
                 hops, the hop counts rog reads off its records' graphs);
                 kgreasoner.kg.base, the KG interface and its id vocabulary (literals, `^rel`),
                 which the format readers write literal ids with; kgreasoner.records.http, the HTTP
                 client with retries that every remote client and backend shares
 2. kg           kgreasoner.kg: the stores (memory, oxigraph, SPARQL, RoG subgraphs) and their commands
 3. datasets     kgreasoner.data itself and the rest of it (datasets, path_search, prepare): a
                 dataset comes with its KB, and these open it and search relation paths over it
 4. retrieval    kgreasoner.retrieval: the search tool, its ranker and the ranker's training
 5. rollout      kgreasoner.rollout: the engine and its generation backends
 6. models       kgreasoner.tokenizer, kgreasoner.models (one unit: models trains its tokenizer)
 7. llm          kgreasoner.llm: clients and the backend factory over rollout's backends and models
 8. rewards      kgreasoner.rewards
 9. methods      kgreasoner.training | kgreasoner.baselines
10. evaluation   kgreasoner.evaluation: the harness runs baselines and our model
11. jobs         kgreasoner.serving | data_gen (data_gen scores its pipelines with evaluation's metrics)
12. stages       kgreasoner.stages | kgreasoner.demo_report
13. demo         kgreasoner.demo
14. ablate       kgreasoner.ablate: variants of the demo's stages
15. cli          kgreasoner.cli

An import inside a function or under `if TYPE_CHECKING` counts like one at the top of the file.
`from a.b import c` imports the module `a.b.c` when there is one, else `a.b`; a package's
`__init__` is a module of its own (importing `a.b.c` runs it too, but every `__init__` here
re-exports its own modules, so counting that would merge each package into one node).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("kgreasoner", "data_gen")

LAYERS: list[list[str]] = [
    [
        "kgreasoner",
        "kgreasoner.config",
        "kgreasoner.protocol",
        "kgreasoner.records.schema",
        "kgreasoner.records.trajectories",
        "kgreasoner.records.normalize",
        "kgreasoner.records.paths",
        "kgreasoner.records.splits",
        "kgreasoner.records.sampling",
        "kgreasoner.records.pathquestion",
        "kgreasoner.records.tog_json",
        "kgreasoner.records.webqsp_cwq",
        "kgreasoner.records.rog",
        "kgreasoner.records.hops",
        "kgreasoner.kg.base",
        "kgreasoner.records.http",
    ],
    ["kgreasoner.kg"],
    ["kgreasoner.data"],
    ["kgreasoner.retrieval"],
    ["kgreasoner.rollout"],
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
# Entries that share a unit with another: a unit's modules may import each other.
UNITS = {
    "kgreasoner.tokenizer": "kgreasoner.models",
    # The bottom layer is one unit: its entries are split only to keep kgreasoner.data's and
    # kgreasoner.kg's other modules out of it.
    **{entry: "records" for entry in LAYERS[0]},
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for top in SOURCES for p in (root / top).rglob("*.py"))


def place(module: str) -> tuple[int, str] | None:
    """(layer index, unit) of the longest entry that is the module or a package above it."""
    best: tuple[int, str] | None = None
    best_len = -1
    entries = [(i, e) for i, layer in enumerate(LAYERS) for e in layer] + [
        (next(i for i, layer in enumerate(LAYERS) if unit in layer), entry)
        for entry, unit in UNITS.items()
        if unit != "records"
    ]
    for index, entry in entries:
        if (module == entry or module.startswith(entry + ".")) and len(entry) > best_len:
            best, best_len = (index, UNITS.get(entry, entry)), len(entry)
    return best


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
        here = place(module)
        if here is None:
            problems.append(f"{module}: in no layer (add it to LAYERS in tests/test_layering.py)")
            continue
        for path, line, target in edges:
            there = place(target)
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


def test_the_layer_table_names_real_modules():
    modules = {module_name(p) for p in source_files()}
    stale = [
        entry
        for layer in LAYERS
        for entry in layer
        if not any(m == entry or m.startswith(entry + ".") for m in modules)
    ]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


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
        ("kgreasoner.kg.base", 0),
        ("kgreasoner.kg.memory", 1),
        ("kgreasoner.data", 2),
        ("kgreasoner.data.datasets", 2),
        ("kgreasoner.tokenizer", 5),
        ("kgreasoner.records.http", 0),
        ("kgreasoner.llm.clients", 6),
        ("kgreasoner.rewards", 7),
        ("data_gen.warmup", 10),
        ("kgreasoner.cli", 14),
    ],
)
def test_modules_land_in_their_layer(module, layer):
    assert place(module)[0] == layer
