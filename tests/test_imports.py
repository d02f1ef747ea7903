"""The packages stand in floors, each importing only from the floors below it, and no module imports itself back.

Every .py file under faults/, jobs/, engine/, storage/, migrations/ and toyworld/ is parsed with `ast`, and every import
in it counts: at module level, inside a function, and under `if TYPE_CHECKING:` alike (a type-only import still makes a
reader open the other package first). There is no exception list: an import that needs one means a piece belongs on a
lower floor (a key layout, a value type, a worker's name), and moving it there is the fix. docs/ARCHITECTURE.md's
"Layout" states the same floors and why.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = ("faults", "jobs", "engine", "storage", "migrations", "toyworld")

# Bottom to top. A package imports only from floors below its own; packages on one floor do not import each other.
FLOORS: tuple[tuple[str, ...], ...] = (
    # What an error decides (retry, fail now, hand back): carried by the engine's errors and the stores' alike.
    ("faults",),
    # Leaves: the engine (frames from a batch of requests), the stores and the encoder, the error tree, and what a
    # process shows the outside (its metrics, its JSON logs, its name host:pid in leases, sessions and attempts).
    ("engine", "storage", "jobs.errors", "jobs.observe"),
    # What a run asks for, checked completely (its webhook against the allowed prefixes, its keys against the store's
    # limits, with the key layout), as frozen specs.
    ("jobs.manifest",),
    # Rows, statuses and queries: a spec becomes rows.
    ("jobs.db",),
    # Rates, charges, estimates and projections, over the rows.
    ("jobs.cost",),
    # The settings (they carry cost's rates) and the reports (figures, summaries, result files; capacity) beside them.
    ("jobs.settings", "jobs.reports"),
    # A finished run's result files and its webhook, noticed by the render and by the sweeper.
    ("jobs.notify",),
    # Taking work: claims, the claim gate (budgets, deadlines) and leases.
    ("jobs.claims",),
    # A claimed batch through the engine to the store and the rows.
    ("jobs.render",),
    # The worker: the Celery app and tasks, a process's hooks, shutdown, the sweeper, schedules, deadlines.
    ("jobs.work",),
    # Apart from the product, above every floor of it so that none can import them: the toy world and its training
    # and distillation, quality measurement, benchmarks.
    ("toyworld",),
    ("jobs.quality",),
    ("jobs.bench",),
    # What the product does, written once (submit, estimate, status, cancel, resume, budget, reports, teams and
    # tokens, schedules): the hall both front doors open onto.
    ("jobs.usecases",),
    # The two front doors, side by side and neither importing the other: the command line (typer, rich) and the
    # HTTP API teams share (FastAPI). Each parses, calls a use case and presents its result.
    ("jobs.cli", "jobs.service"),
    # The program: the command line plus `serve`, joined here.
    ("jobs.main", "migrations"),
    ("jobs.__main__",),
)
FLOOR = {package: level for level, floor in enumerate(FLOORS) for package in floor}
# The product's path (manifest -> db -> claims -> render -> storage -> cost -> reports, and the worker) and what
# stands apart from it: measurement and training.
PRODUCT = ("faults", "engine", "storage", "jobs.errors", "jobs.observe", "jobs.manifest", "jobs.db", "jobs.cost",
           "jobs.settings", "jobs.reports", "jobs.notify", "jobs.claims", "jobs.render", "jobs.work")
APART = ("toyworld", "jobs.quality", "jobs.bench")
# The namespace that holds the jobs floors: its own __init__ imports nothing.
NAMESPACES = ("jobs",)


@dataclass(frozen=True)
class Import:
    source: str  # importing module, dotted
    target: str  # imported module of the tree, dotted
    file: str  # relative to the repository
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.source} -> {self.target}"


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the trees by dotted name: its file, and whether it is a package's __init__."""
    found = {}
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module of the tree that `name` imports (its longest dotted prefix that is one); None outside the tree."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports() -> list[Import]:
    out = []
    for module, (path, package) in MODULES.items():
        here = module if package else module.rpartition(".")[0]
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the package `level - 1` above this one
                    base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                # `from a.b import c` imports the module a.b.c when there is one, else a name of a.b.
                names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in MODULES else origin for a in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] not in TREES:
                    continue
                target = _resolve(name)
                assert target is not None, f"{rel}:{node.lineno}: {module} imports {name}, which is no module here"
                if target != module:
                    out.append(Import(module, target, rel, node.lineno))
    return out


IMPORTS = _imports()


def package_of(module: str) -> str | None:
    """The floor table's package that holds `module`: its longest dotted prefix in FLOORS."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FLOOR:
            return ".".join(parts[:n])
    return None


def test_every_module_stands_on_a_floor():
    loose = [m for m in MODULES if package_of(m) is None and m not in NAMESPACES]
    assert not loose, "modules on no floor (add their package to FLOORS, and to docs/ARCHITECTURE.md's Layout): " + ", ".join(loose)
    for namespace in NAMESPACES:
        assert not [i for i in IMPORTS if i.source == namespace], f"{namespace}/__init__.py imports something"


def test_no_import_goes_up_a_floor_or_sideways():
    wrong = []
    for i in IMPORTS:
        source, target = package_of(i.source), package_of(i.target)
        if source is None or target is None or source == target:
            continue
        if FLOOR[target] >= FLOOR[source]:
            way = "up" if FLOOR[target] > FLOOR[source] else "sideways"
            wrong.append(f"{i}  ({way}: {source} on floor {FLOOR[source]} -> {target} on floor {FLOOR[target]})")
    assert not wrong, "imports that do not go down a floor:\n" + "\n".join(wrong)


def cycles(modules, imports: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    graph: dict[str, list[str]] = {m: [] for m in modules}
    for i in imports:
        graph[i.source].append(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_module_imports_itself_back():
    lines = []
    for component in cycles(MODULES, IMPORTS):
        members = set(component)
        lines.append(f"a cycle through {len(component)} modules:")
        lines += [f"  {i}" for i in IMPORTS if i.source in members and i.target in members]
    assert not lines, "\n".join(lines)


def test_the_cycle_finder_finds_a_cycle_and_nothing_else():
    """The check above is only as good as `cycles`: a hand-built graph with one cycle of three, a tail out of it and
    a module that imports nothing."""
    imports = [Import("a", "b", "a.py", 1), Import("b", "c", "b.py", 1), Import("c", "a", "c.py", 1),
               Import("c", "d", "c.py", 2)]
    assert cycles(["a", "b", "c", "d", "e"], imports) == [["a", "b", "c"]]
    assert cycles(["a", "b", "c", "d", "e"], imports[:2] + imports[3:]) == []


def test_the_product_stands_below_what_stands_apart():
    """Measurement and training (the toy world's training and distillation, quality, bench) on floors above every
    floor of the product, so the floor rule keeps the product from importing any of them."""
    assert max(FLOOR[p] for p in PRODUCT) < min(FLOOR[p] for p in APART)
    assert set(PRODUCT) | set(APART) | {"jobs.usecases", "jobs.cli", "jobs.service", "jobs.main", "jobs.__main__",
                                          "migrations"} == set(FLOOR)


def test_neither_front_door_imports_the_other():
    """The command line and the HTTP API both stand on the use cases; neither reaches into the other's modules."""
    crossing = [i for i in IMPORTS
                if {package_of(i.source), package_of(i.target)} == {"jobs.cli", "jobs.service"}]
    assert not crossing, "\n".join(str(i) for i in crossing)
