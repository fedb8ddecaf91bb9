"""The import structure issue 28 asks for: config -> models -> spec -> sample -> engine -> serve, the apps side by side.

Read with grimp (the import graph of every ``import`` statement in ``src/eyas``, those inside functions
and under ``TYPE_CHECKING`` too), so a lazy import cannot hide a dependency. Each test names the import
chain it found, so a failure says which line to move.
"""

from __future__ import annotations

import itertools

import grimp  # in eyas's [test] extra
import pytest

# The apps: each is a command (eyas prepare / doctor / bench / train / serve) and none imports another,
# except where an app reads what another writes on purpose.
APPS = ("eyas.data", "eyas.doctor", "eyas.bench", "eyas.train", "eyas.serve")
ALLOWED_APP_IMPORTS = {
    ("eyas.train", "eyas.data"): "training reads the tokenized data folder `eyas prepare` writes",
}
# What the engine and the layers below it must never import, directly or through others.
ABOVE_ENGINE = (*APPS, "eyas.formats", "eyas.common", "eyas.pipeline", "eyas.cli", "eyas.demo", "eyas.export",
                "eyas.generate")
# The layers under the apps, lowest first: the transformer block, speculative decoding's tree, drafting and
# verification, what turns logits into tokens (sampling settings, penalties, grammar masks, logprobs), the engine.
# Each may import those before it, never one after.
LAYERS = ("eyas.models", "eyas.spec", "eyas.sample", "eyas.engine")


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("eyas", cache_dir=None)


def cycles(graph) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def describe(graph, component: frozenset[str]) -> str:
    lines = []
    for a, b in itertools.permutations(sorted(component), 2):
        for d in graph.get_import_details(importer=a, imported=b):
            lines.append(f"  {a} -> {b} (line {d['line_number']}: {d['line_contents']})")
    return "\n".join(lines)


def test_no_module_imports_one_that_imports_it(graph):
    found = cycles(graph)
    assert not found, ("import circles (move the shared piece below both modules):\n"
                       + "\n".join(describe(graph, c) for c in found))


def test_cycle_finder_finds_a_circle():
    """The check above can fail: two modules importing each other are found, a chain is not."""
    g = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        g.add_module(m)
    g.add_import(importer="p.a", imported="p.b")
    g.add_import(importer="p.b", imported="p.c")
    assert cycles(g) == []
    g.add_import(importer="p.c", imported="p.a")
    assert cycles(g) == [frozenset({"p.a", "p.b", "p.c"})]


@pytest.mark.parametrize("low", LAYERS)
def test_the_engine_imports_no_app(graph, low):
    bad = {high: graph.find_shortest_chain(importer=low, imported=high, as_packages=True)
           for high in ABOVE_ENGINE if high in graph.modules}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"{low} reaches code above it: " + "; ".join(" -> ".join(c) for c in bad.values())


@pytest.mark.parametrize("low,high", list(itertools.combinations(LAYERS, 2)))
def test_layers_import_only_those_below(graph, low, high):
    chain = graph.find_shortest_chain(importer=low, imported=high, as_packages=True)
    assert chain is None, f"{low} reaches {high}, a layer above it: " + " -> ".join(chain)


@pytest.mark.parametrize("importer,imported", [p for p in itertools.permutations(APPS, 2)
                                               if p not in ALLOWED_APP_IMPORTS])
def test_apps_sit_side_by_side(graph, importer, imported):
    chain = graph.find_shortest_chain(importer=importer, imported=imported, as_packages=True)
    assert chain is None, (f"{importer} imports {imported}: " + " -> ".join(chain)
                           + " (move what both need into eyas.common)")


def test_shared_pieces_import_no_app(graph):
    bad = [graph.find_shortest_chain(importer="eyas.common", imported=app, as_packages=True) for app in APPS]
    bad = [c for c in bad if c]
    assert not bad, "eyas.common reaches an app: " + "; ".join(" -> ".join(c) for c in bad)


def test_no_module_over_400_lines():
    """Issue 28's bound: a module read in one sitting. Split a file that grows past it by concept."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "eyas"
    long = {str(p.relative_to(src)): n for p in sorted(src.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"modules over 400 lines: {long}"
