"""The package's shape, as docs/ARCHITECTURE.md draws it: each layer imports only from the layers below
it, no two files import each other even through others (imports inside functions count too), and no
function grows past what a reader takes in at once."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "burnout"

# Bottom to top; a package or top-level module may import from any earlier layer, never from its own
# layer's other members or a later one.
LAYERS = [
    {"errors"},
    {"base"},
    {"config"},
    {"models", "data"},
    {"core"},
    {"generate"},
    {"eval"},
    {"train"},
    {"finetune"},
    {"forensics", "runs"},
    {"bench", "report"},
    {"playground", "serve", "quickstart", "speedrun"},
    {"cli"},
    {"__main__"},
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}
MAX_FUNCTION_LINES = 100


def _unit(module: str) -> str:
    """burnout.train.loop → train; burnout.config → config; burnout → burnout (the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield path, module, ast.parse(path.read_text(encoding="utf-8"))


def _imports(module: str, tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            pytest.fail(f"{module}:{node.lineno}: a relative import; burnout imports absolutely (burnout.x.y)")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "burnout":
            names = [f"burnout.{a.name}" for a in node.names] if node.module == "burnout" else [node.module]
            for name in names:
                yield name, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "burnout":
                    yield alias.name, node.lineno


def _module_graph() -> dict[str, set[str]]:
    """Module → the burnout modules it imports (a package's __init__ is the module named by the package)."""
    modules = {module: tree for _, module, tree in _modules()}
    graph = {module: set() for module in modules}
    for module, tree in modules.items():
        for target, _ in _imports(module, tree):
            # `from burnout.x import y`: y is a module of its own, or a name in burnout.x.
            parent, _, name = target.rpartition(".")
            graph[module] |= {t for t in (target, parent if name and target not in modules else None)
                              if t in modules and t != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
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
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                    cycles.append(sorted(component))
    return cycles


def test_cycles_are_found_between_two_files_and_through_a_third():
    assert import_cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_two_modules_import_each_other():
    cycles = import_cycles(_module_graph())
    assert not cycles, "modules that import each other (directly or through others):\n" + "\n".join(
        " ↔ ".join(cycle) for cycle in cycles)


def test_every_package_and_top_level_module_has_a_layer():
    units = {_unit(module) for _, module, _ in _modules()} - {"burnout"}
    assert units <= set(LAYER_OF), f"add {sorted(units - set(LAYER_OF))} to LAYERS here and in docs/ARCHITECTURE.md"


def test_imports_point_down_the_layers():
    wrong = []
    for path, module, tree in _modules():
        source = _unit(module)
        for target, line in _imports(module, tree):
            dest = _unit(target)
            if dest == source or dest == "burnout" or source == "burnout":
                continue
            if LAYER_OF[dest] >= LAYER_OF[source]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} {source} imports {target}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


@pytest.mark.parametrize("package", ["models"])
def test_models_depend_on_config_and_errors_alone(package):
    allowed = {"config", "errors", "base", package}
    for _, module, tree in _modules():
        if _unit(module) == package:
            assert {_unit(t) for t, _ in _imports(module, tree)} <= allowed, module


def test_no_function_is_longer_than_a_sitting():
    long = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, _, tree in _modules() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "split these functions:\n" + "\n".join(long)


# ----------------------------------------------------------------------------------------------
# docs/ARCHITECTURE.md: the map kept true

ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"
MAX_CELL_CHARS = 400


def _table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row in `text` (separator rows left out)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _package_rows() -> list[list[str]]:
    """The rows of docs/ARCHITECTURE.md's package table (its header left out)."""
    table = ARCHITECTURE.read_text(encoding="utf-8").split("## Packages, bottom to top", 1)[1].split("\n## ", 1)[0]
    return _table_rows(table)[1:]


def _units_table() -> dict[str, tuple[int, set[str]]]:
    """docs/ARCHITECTURE.md's package table: unit (`train`, `cli`, ...) → (its layer, the modules it lists)."""
    units = {}
    for layer, unit, *_, modules in _package_rows():
        name = unit.strip("`").removesuffix("/").removesuffix(".py")
        units[name] = int(layer), set(re.findall(r"`([\w]+\.py)`", modules))
    return units


def test_every_cell_of_the_architecture_map_is_short():
    long = [cell[:60] + "…" for row in _table_rows(ARCHITECTURE.read_text(encoding="utf-8")) for cell in row
            if len(cell) > MAX_CELL_CHARS]
    assert not long, f"cells over {MAX_CELL_CHARS} characters in docs/ARCHITECTURE.md: {long}"


def test_the_architecture_map_lists_every_unit_in_its_layer_and_every_module_in_its_package():
    units = _units_table()
    assert set(units) == set(LAYER_OF), "docs/ARCHITECTURE.md's package table and LAYERS name different units"
    for name, (layer, listed) in units.items():
        assert layer == LAYER_OF[name] + 1, f"{name}: layer {layer} in docs/ARCHITECTURE.md, {LAYER_OF[name] + 1} here"
        folder = PACKAGE / name
        files = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"} if folder.is_dir() else set()
        assert listed == files, f"{name}/: docs/ARCHITECTURE.md lists {sorted(listed)}, the package has {sorted(files)}"


def test_the_architecture_map_lists_every_module_once():
    """Every file of burnout/, however deep, once in the table: a top-level module as its unit, a package's in its
    row (the README's tree names only the units)."""
    listed = []
    for _, unit, *_, modules in _package_rows():
        unit = unit.strip("`")
        listed += [unit] if unit.endswith(".py") else [unit + name for name in re.findall(r"`([\w]+\.py)`", modules)]
    files = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"]
    assert sorted(listed) == sorted(files), (
        f"not in docs/ARCHITECTURE.md's table: {sorted(set(files) - set(listed))}; listed but gone: "
        f"{sorted(set(listed) - set(files))}; listed twice: {sorted({n for n in listed if listed.count(n) > 1})}")
