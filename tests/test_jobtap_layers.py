# SPDX-License-Identifier: LGPL-3.0-only
"""The jobtap plugin's sources are layers: the calls between its files go one way.

``jobtap/dws-jobtap.h`` lists the sources from the bottom up.  A file may use a function of a
file listed before it (call it, or name it as a callback or in a table), never one of a file
listed after it, so no two files need each other.  Each file names its layer and the files it
calls at its top, and the Makefile builds exactly the listed files.  The C is read as text
(comments, strings and member names left out), so this needs no compiler and no flux-core.
"""

from __future__ import annotations

import re
from pathlib import Path

JOBTAP = Path(__file__).resolve().parent.parent / "jobtap"
HEADER = "dws-jobtap.h"

#: A function definition: at the start of a line, a return type, a name, parameters, a brace.
DEFINITION = re.compile(
    r"^(static\s+)?[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)\s*\(([^;{}]*)\)\s*\{", re.MULTILINE
)
#: A prototype in the header: a declaration that starts a line (struct members are indented).
PROTOTYPE = re.compile(r"^(?!typedef\b)[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)\s*\(", re.MULTILINE)
#: A name used in code, but not a member (``st->started``, ``ps.msg``).
NAME = re.compile(r"(?<!->)(?<!\.)\b([A-Za-z_]\w*)\b")

Graph = dict[str, dict[str, set[str]]]


def code(text: str) -> str:
    """The C text without comments, string literals and character literals."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group().count("\n"), text, flags=re.DOTALL)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"'(?:\\.|[^'\\\n])*'", "''", text)


def layer_order(root: Path) -> list[str]:
    """The sources as the header lists them, bottom layer first (`` *    1 util.c  ...``)."""
    rows = re.findall(r"^ \*\s+(\d+) ([\w-]+\.c)\s", (root / HEADER).read_text(), re.MULTILINE)
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1)), rows
    return [name for _, name in rows]


def sources(root: Path) -> dict[str, str]:
    return {p.name: code(p.read_text()) for p in sorted(root.glob("*.c"))}


def definitions(texts: dict[str, str]) -> tuple[dict[str, str], dict[str, set[str]]]:
    """Each file's non-static functions (name -> file), and each file's static ones."""
    public: dict[str, str] = {}
    static: dict[str, set[str]] = {name: set() for name in texts}
    for name, text in texts.items():
        for match in DEFINITION.finditer(text):
            if match.group(1):
                static[name].add(match.group(2))
            else:
                assert match.group(2) not in public, f"{match.group(2)} defined twice"
                public[match.group(2)] = name
    return public, static


def file_graph(root: Path) -> Graph:
    """caller file -> callee file -> the callee's functions the caller uses."""
    texts = sources(root)
    public, static = definitions(texts)
    graph: Graph = {name: {} for name in texts}
    for name, text in texts.items():
        for used in set(NAME.findall(text)) - static[name]:
            home = public.get(used)
            if home and home != name:
                graph[name].setdefault(home, set()).add(used)
    return graph


def upward_calls(graph: Graph, order: list[str]) -> list[str]:
    rank = {name: i for i, name in enumerate(order)}
    return [
        f"{caller} (layer {rank[caller] + 1}) uses {callee} (layer {rank[callee] + 1}):"
        f" {', '.join(sorted(used))}"
        for caller, callees in sorted(graph.items())
        for callee, used in sorted(callees.items())
        if rank[callee] >= rank[caller]
    ]


def cycle(graph: Graph) -> list[str]:
    """A circle of files that use each other, or [] when the graph has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str]:
        state[name] = 1
        path.append(name)
        for callee in sorted(graph.get(name, {})):
            if state.get(callee) == 1:
                return [*path[path.index(callee) :], callee]
            if callee not in state and (found := visit(callee)):
                return found
        state[name] = 2
        path.pop()
        return []

    for name in sorted(graph):
        if name not in state and (found := visit(name)):
            return found
    return []


def stated_layer(text: str) -> tuple[int, int, set[str]]:
    """What a file says at its top: "Layer N of M (dws-jobtap.h) ...; calls a.c and b.c."."""
    # the first comment after the SPDX banner, which ends with a line \*****/
    comment = re.search(r"^\\\*+/\s*(/\*.*?\*/)", text, re.MULTILINE | re.DOTALL)
    words = " ".join(line.strip(" *") for line in comment.group(1).splitlines())
    match = re.search(r"Layer (\d+) of (\d+) \(dws-jobtap\.h\).*?\bcalls (.*?)\.(?:\s|$)", words)
    assert match, f"no 'Layer N of M (dws-jobtap.h) ... calls ...' in: {words}"
    return int(match.group(1)), int(match.group(2)), set(re.findall(r"[\w-]+\.c", match.group(3)))


def test_the_layer_list_names_every_source_and_the_makefile_builds_them_in_order():
    order = layer_order(JOBTAP)
    assert len(order) == len(set(order)) >= 10
    assert set(order) == {p.name for p in JOBTAP.glob("*.c")}
    makefile = (JOBTAP / "Makefile").read_text()
    listed = re.search(r"^SOURCES = \\\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert re.findall(r"[\w-]+\.c", listed) == order
    assert order[-1] == "dws-jobtap.c"  # flux_plugin_init() and the job callbacks: the top


def test_the_reader_finds_every_function_the_header_declares():
    public, _ = definitions(sources(JOBTAP))
    declared = set(PROTOTYPE.findall(code((JOBTAP / HEADER).read_text())))
    assert declared == set(public) - {"flux_plugin_init"}


def test_files_use_only_the_layers_below_them():
    graph = file_graph(JOBTAP)
    assert sum(len(callees) for callees in graph.values()) >= 20  # the reader sees the calls
    assert upward_calls(graph, layer_order(JOBTAP)) == []
    assert cycle(graph) == []


def test_each_file_names_its_layer_and_the_files_it_calls():
    order = layer_order(JOBTAP)
    graph = file_graph(JOBTAP)
    for rank, name in enumerate(order, 1):
        number, total, calls = stated_layer((JOBTAP / name).read_text())
        assert (number, total) == (rank, len(order)), name
        assert calls == set(graph[name]), f"{name} says it calls {sorted(calls)}"


def test_the_reader_sees_a_circle_and_a_call_upward(tmp_path):
    (tmp_path / HEADER).write_text(" *    1 low.c   the bottom\n *    2 high.c  the top\n")
    (tmp_path / "low.c").write_text(
        "/* high_fn ( in a comment */\n"
        "static int helper (void)\n{\n    return 0;\n}\n\n"
        'int low_fn (int x)\n{\n    return x ? helper () : puts ("high_fn ()");\n}\n\n'
        "void low_register (void)\n{\n    table.cb = high_cb;  // a callback: used, not called\n}\n"
    )
    (tmp_path / "high.c").write_text(
        "int high_fn (void)\n{\n    return low_fn (1) + st->low_register;\n}\n\n"
        "void high_cb (void *arg)\n{\n}\n"
    )
    graph = file_graph(tmp_path)
    assert graph == {"high.c": {"low.c": {"low_fn"}}, "low.c": {"high.c": {"high_cb"}}}
    assert upward_calls(graph, layer_order(tmp_path)) == [
        "low.c (layer 1) uses high.c (layer 2): high_cb"
    ]
    assert cycle(graph) == ["high.c", "low.c", "high.c"]
