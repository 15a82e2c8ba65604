# SPDX-License-Identifier: LGPL-3.0-only
"""The package's layers, read from its imports: nothing imports against them, nothing circles.

A module may import its own layer and the layers below it.  ``k8s`` and ``flux`` are side by
side: each adapter knows only its own system.  The top-level modules are entry points (the
``flux dws`` command, ``python -m flux_dws.daemon``, the job-ingest validator).  Every import
counts, also those inside functions and under ``TYPE_CHECKING``: a circle drawn only for the
type checker is still a circle a reader has to untangle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "flux_dws"

#: Each layer with the layers it may import, beside its own.
LAYERS: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "core": frozenset({"base"}),
    "k8s": frozenset({"base", "core"}),
    "flux": frozenset({"base", "core"}),
    "service": frozenset({"base", "core", "k8s", "flux"}),
    "testing": frozenset({"base", "core", "k8s", "flux", "service"}),
    "cli": frozenset({"base", "core", "k8s", "flux", "service", "testing"}),
    "entry": frozenset({"base", "core", "k8s", "flux", "service", "testing", "cli"}),
}
#: What the pure core and the bases may not import: the systems and the ways to reach them.
IO_MODULES = frozenset(
    {"kubernetes", "urllib3", "flux", "_flux", "socket", "subprocess", "http", "pwd", "grp"}
    | {"prometheus_client", "requests", "ssl", "select", "selectors", "signal"}
)
#: The validator runs in job-ingest's Python, which may have nothing but the standard library.
VALIDATOR_LAYERS = frozenset({"base", "core"})


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = modules()


PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def layer(module: str) -> str:
    """The layer a module belongs to: its package under flux_dws, or "entry" for the
    top-level modules."""
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and module not in PACKAGES):
        return "entry"
    return parts[1]


def imports(module: str) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in ``module``, resolved to our modules or to
    the top-level name of anything else."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield _ours(alias.name), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                yield (full if full in MODULES else _ours(source)), node.lineno


def _ours(name: str) -> str:
    """The longest of our modules that ``name`` names, or its top-level package."""
    while name and name not in MODULES:
        if "." not in name:
            return name
        name = name.rpartition(".")[0]
    return name


def graph() -> dict[str, set[str]]:
    return {
        m: {i for i, _ in imports(m) if i in MODULES and i != m and i != "flux_dws"}
        for m in MODULES
    }


def test_the_tree_has_the_layers():
    assert {layer(m) for m in MODULES} == set(LAYERS)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_runs_against_the_layers(module):
    mine = layer(module)
    wrong = [
        f"{module}:{line} imports {target} ({layer(target)})"
        for target, line in imports(module)
        if target in MODULES
        and target != "flux_dws"
        and layer(target) != mine
        and layer(target) not in LAYERS[mine]
    ]
    assert not wrong


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) in ("base", "core")))
def test_the_core_and_the_bases_do_no_io(module):
    io = [f"{module}:{line} imports {t}" for t, line in imports(module) if t in IO_MODULES]
    assert not io


def test_no_import_circle():
    edges = graph()
    circles = [c for c in _components(edges) if len(c) > 1]
    assert not circles, " ; ".join(" <-> ".join(sorted(c)) for c in circles)


def test_the_validator_needs_only_the_standard_library_and_the_core():
    edges = graph()
    seen, todo = set(), ["flux_dws.validator"]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(edges[module])
    outside = {m for m in seen - {"flux_dws.validator"} if layer(m) not in VALIDATOR_LAYERS}
    assert not outside
    # flux itself only in the validator's plugin class, which job-ingest instantiates
    third_party = {
        f"{m} imports {t}"
        for m in seen
        for t, _ in imports(m)
        if t in _THIRD_PARTY and not (m == "flux_dws.validator" and t == "flux")
    }
    assert not third_party


#: Packages from outside the standard library (tomli, tomllib's backport for Python 3.9 and
#: 3.10, counts as standard).
_THIRD_PARTY = frozenset(
    {"kubernetes", "urllib3", "yaml", "prometheus_client", "tqdm", "flux", "_flux", "cffi"}
)


def test_the_checks_see_a_circle_and_a_wrong_import():
    """The checks above are only worth something if they can fail: a circle and an import
    against the layers, planted in a copy of the module table, are both found."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert [sorted(c) for c in _components(edges) if len(c) > 1] == [["a", "b", "c"]]
    assert "core" not in LAYERS["base"] and "service" not in LAYERS["core"]
    assert layer("flux_dws.core.lifecycle") == "core"
    assert layer("flux_dws.validator") == "entry"
    assert layer("flux_dws.k8s") == "k8s"


def _components(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components (Tarjan), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    found.append(component)
    return found
