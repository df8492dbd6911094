"""The package's shape, as docs/ARCHITECTURE.md draws it: each layer imports only from the layers below
it (imports inside functions count too), and no function grows past what a reader takes in at once."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "burnout"

# Bottom to top; a package or top-level module may import from any earlier layer, never from its own
# layer's other members or a later one.
LAYERS = [
    {"errors"},
    {"common"},
    {"config"},
    {"models", "data"},
    {"core"},
    {"generate"},
    {"eval"},
    {"train"},
    {"bench", "report"},
    {"playground", "quickstart"},
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
    allowed = {"config", "errors", "common", package}
    for _, module, tree in _modules():
        if _unit(module) == package:
            assert {_unit(t) for t, _ in _imports(module, tree)} <= allowed, module


def test_no_function_is_longer_than_a_sitting():
    long = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, _, tree in _modules() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "split these functions:\n" + "\n".join(long)
