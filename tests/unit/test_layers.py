"""The library's import graph: no cycles, layers that point one way, no Snakemake.

Every ``tiny_llm`` module's imports are read with ``ast`` (imports inside functions included, since a
lazy import is still a dependency), so nothing is imported to run these checks. Imports under
``if TYPE_CHECKING:`` are for annotations only and never run; they are not edges.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tiny_llm

PACKAGE_DIR = Path(tiny_llm.__file__).parent
ROOT = PACKAGE_DIR.parent

# Higher layers may import lower ones; a layer never imports a higher one or a sibling of its own rank.
# Modules outside these groups are core. docs/architecture.md states the same table (checked below).
LAYER_RANKS = {
    "core": 0,
    "runtime": 1,  # device, environment, signals, optimizer helpers, MFU, the engine contract
    "train": 2,  # the ordinary engine, the training loop, checkpoints, metrics, evaluation
    "packed": 2,  # the packed engine and its parts
    "engines": 3,  # which engine a recipe needs; the training and evaluation entry points
    "analysis": 3,  # second-order analysis of saved states (stands on data, runtime, train, packed)
    "report": 3,  # comparison report of finished runs (reads metrics as train writes them; torch-free)
    "bench": 4,  # benchmark workers, the packed benchmark, profiling
    "tuning": 4,  # the staged throughput tuner (runs the benchmark worker as a process)
    "export": 4,  # Hugging Face export, generation, sample tables
    "pipeline": 5,  # the workflow plan
    "commands": 6,  # the CLI (tiny_llm.cli, tiny_llm.__main__, tiny_llm.commands.*)
}
GROUP_OF_TOP_MODULE = {"engines": "engines", "cli": "commands", "__main__": "commands"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def library_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those in ``if TYPE_CHECKING:`` bodies."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))
    return found


def imported_names(name: str, path: Path) -> set[str]:
    """Absolute dotted names ``name`` imports (``from a import b`` gives a.b as well as a)."""
    is_package = path.name == "__init__.py"
    names = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = name.split(".")
            anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
            base = ".".join(anchor + ([base] if base else []))
        names.add(base)
        names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports (a name resolves to the longest module prefix)."""
    modules = library_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for imported in imported_names(name, path):
            parts = imported.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            target = ".".join(parts)
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) < 2:
        return "core"
    top = parts[1]
    return GROUP_OF_TOP_MODULE.get(top, top if top in LAYER_RANKS else "core")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for source, targets in sorted(graph.items()):
        low = layer_of(source)
        for target in sorted(targets):
            high = layer_of(target)
            if high != low and LAYER_RANKS[high] >= LAYER_RANKS[low]:
                out.append(f"{source} ({low}) imports {target} ({high})")
    return out


def layer_order() -> str:
    """The layers in one line, lowest first: ``core <- runtime <- train | packed <- ...``."""
    ranks = sorted(set(LAYER_RANKS.values()))
    return " <- ".join(" | ".join(k for k, v in LAYER_RANKS.items() if v == r) for r in ranks)


def documented_layers() -> dict[str, tuple[int, set[str]]]:
    """docs/architecture.md's layer table: layer -> (rank, its top-level packages and modules)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| (\w+) \| (.+) \|$", text, re.M)
    return {layer: (int(rank), set(re.findall(r"`(\w+)/?`", names))) for rank, layer, names in rows}


def test_the_docs_state_the_same_layers_and_packages() -> None:
    documented = documented_layers()
    assert {layer: rank for layer, (rank, _) in documented.items()} == LAYER_RANKS
    tops = {name.split(".")[1] for name in library_modules() if "." in name}
    listed = [name for _, names in documented.values() for name in names]
    assert sorted(listed) == sorted(tops), "docs/architecture.md's layer table must name each package once"
    for layer, (_, names) in documented.items():
        for name in names:
            assert layer_of(f"tiny_llm.{name}") == layer, f"docs put {name} in {layer}"
    for doc in ("docs/architecture.md", "README.md"):
        text = " ".join((ROOT / doc).read_text(encoding="utf-8").split())
        assert layer_order() in text, f"{doc} must state the layers as: {layer_order()}"


def test_imports_are_read_at_any_depth_but_not_for_type_checking(tmp_path: Path) -> None:
    source = tmp_path / "engine.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import tiny_llm.io\n"
        "from . import model\n"
        "if TYPE_CHECKING:\n"
        "    from tiny_llm.config import RecipeConfig\n"
        "def build():\n"
        "    from tiny_llm.packed.engine import PackedEngine\n",
        encoding="utf-8",
    )
    names = imported_names("tiny_llm.train.engine", source)
    assert {"tiny_llm.io", "tiny_llm.train.model", "tiny_llm.packed.engine.PackedEngine"} <= names
    assert not any(name.startswith("tiny_llm.config") for name in names)


def test_the_library_has_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_layers_point_one_way() -> None:
    violations = layer_violations(import_graph())
    assert not violations, f"layer order {layer_order()} broken:\n  " + "\n  ".join(violations)


def test_no_module_imports_snakemake() -> None:
    offenders = [
        f"{name} imports {imported}"
        for name, path in library_modules().items()
        for imported in imported_names(name, path)
        if imported.split(".")[0] == "snakemake"
    ]
    assert not offenders, "the library must not know Snakemake:\n  " + "\n  ".join(offenders)


def test_cycle_and_layer_checks_name_the_offending_edge() -> None:
    graph = {"tiny_llm.a": {"tiny_llm.b"}, "tiny_llm.b": {"tiny_llm.a"}}
    assert find_cycle(graph) == ["tiny_llm.a", "tiny_llm.b", "tiny_llm.a"]
    upward = {"tiny_llm.runtime.device": {"tiny_llm.train.loop"}, "tiny_llm.train.loop": set()}
    assert layer_violations(upward) == [
        "tiny_llm.runtime.device (runtime) imports tiny_llm.train.loop (train)"
    ]
