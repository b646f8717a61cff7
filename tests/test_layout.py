"""The house plan, checked: imports run one way, no module is too long, the README is the front
door and reaches every docs page."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "skippipe"

# Lower layers never import higher ones: cluster/costs/workload -> plan file -> simulator/bounds
# -> planner -> model/data -> training/eval -> runtime/HDEE -> commands.
LAYERS: dict[str, int] = {
    "skippipe": 0, "skippipe.errors": 0, "skippipe.fileio": 0, "skippipe.config_fields": 0, "skippipe.limits": 0,
    "skippipe.costs": 0, "skippipe.cluster": 0, "skippipe.workload": 0,
    "skippipe.planfile": 1,
    "skippipe.sim": 2, "skippipe.sim_ops": 2, "skippipe.bounds": 2, "skippipe.serial_floor": 2, "skippipe.viz": 2,
    "skippipe.planner": 3, "skippipe.reference": 3,
    "skippipe.model": 4, "skippipe.data": 4,
    "skippipe.train": 5, "skippipe.eval": 5,
    "skippipe.runtime": 6, "skippipe.hdee": 6,
    "skippipe.commands": 7, "skippipe.cli": 7,
}
MAX_MODULE_LINES = 400


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")


def _layer(module: str) -> int:
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name in LAYERS:
            return LAYERS[name]
    raise AssertionError(f"{module} has no layer: add it to LAYERS")


def _imports() -> dict[str, set[str]]:
    """Every skippipe module and the skippipe modules it imports (anywhere in the file)."""
    graph: dict[str, set[str]] = {}
    for f in SRC.rglob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("skippipe"):
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("skippipe"))
        graph[_module_name(f)] = deps
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def test_every_module_has_a_layer():
    for module in _imports():
        _layer(module)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    upward = [
        f"{m} ({_layer(m)}) imports {d} ({_layer(d)})"
        for m, deps in sorted(_imports().items()) for d in sorted(deps) if _layer(d) > _layer(m)
    ]
    assert upward == []


def test_no_import_cycle():
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in _imports().items()}  # a package's own __init__
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_no_module_is_too_long():
    long = {str(f.relative_to(ROOT)): n for f in SRC.rglob("*.py") if (n := len(f.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_noqa_comments():
    marked = [str(f.relative_to(ROOT)) for f in SRC.rglob("*.py") if "# noqa" in f.read_text()]
    assert marked == []


README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_a_front_door():
    assert len(README.read_text().splitlines()) < 300


def test_readme_reaches_every_docs_page():
    targets = {m.split("#")[0] for m in LINK.findall(README.read_text())}
    missing = [f"docs/{p.name}" for p in DOCS if f"docs/{p.name}" not in targets]
    assert missing == []


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert broken == []
