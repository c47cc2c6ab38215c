"""List import circles among the project's own modules, counting every import statement: at module
level, inside functions, and under `if TYPE_CHECKING:` (an annotation names what the module is
written against: that is an arrow of the layout too), so that every arrow points one way.

    python scripts/import_cycles.py            # memcalc and validate; exit 1 if any circle

A circle is a strongly connected component of more than one module of the graph
"module A imports module B". `from pkg import name` counts as importing pkg.name when that is
a module, else pkg.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("memcalc", "validate")
ALLOWED: dict[tuple[str, str], str] = {}
"""Arrows that close a circle, each with why it is there and who removes it: printed, left out
of the graph. Keep this empty."""


def module_name(path: Path) -> str:
    """Dotted module name of a file under ROOT."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """Project modules that `path` imports anywhere in its body."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out.add(full if full in known else node.module)
    return {m for m in out if m in known}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan).

    >>> cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}})
    [['a', 'b']]
    """
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    known = {module_name(p) for p in files}
    graph = {module_name(p): imports(p, known) - {module_name(p)} for p in files}
    # a package's __init__ importing its own submodules is how packages expose them, not a circle
    graph = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    for (a, b), why in ALLOWED.items():
        if b in graph.get(a, ()):
            graph[a].discard(b)
            print(f"allowed arrow: {a} -> {b} ({why})")
    found = cycles(graph)
    for comp in found:
        print("circle: " + " <-> ".join(comp))
    print(f"import_cycles: {len(known)} modules, {sum(map(len, graph.values()))} imports, {len(found)} circles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
