"""The import structure that docs/architecture.md draws: every module of ``src/fedhp`` imports only
its own package and the layers below its own, but for the arrows the doc names (each with why).

An import is any ``import`` / ``from ... import`` statement (at the top, inside a function, or
under ``TYPE_CHECKING``) and any ``importlib.import_module("fedhp....")`` with a literal name:
what a module may reach, not only what it loads first. Run it alone with
``pytest tests/test_architecture.py``; a failure names the file, the line and the layers."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"

LAYERS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    # (name, the modules or packages in it, what it is) from the top down
    ("command", ("fedhp.cli",), "the `fedhp` command line"),
    ("faces", ("fedhp", "fedhp.compare"), "`import fedhp`'s lazy names; `fedhp compare`"),
    ("experiments", ("fedhp.experiments",), "`fedhp reproduce`: the papers' tables, figures"),
    ("sweep", ("fedhp.sweep",), "grids of runs x seeds, batched (`fedhp sweep`)"),
    ("api", ("fedhp.api",), "one run from Python: prepare, build, run"),
    ("flower", ("fedhp.flower",), "the Flower backend: simulation and deployment"),
    (
        "setup",
        ("fedhp.build", "fedhp.unread", "fedhp.extend", "fedhp.cli_args"),
        "RunConfig -> a run; options no run reads; the plugin surface; [CONFIG] [key=value]",
    ),
    ("algorithms", ("fedhp.algorithms",), "one module per method, its math first"),
    ("engine", ("fedhp.engine",), "rounds, local SGD, uplinks, checkpoints; names no method"),
    ("config", ("fedhp.config",), "YAML + key=value -> RunConfig (no torch)"),
    (
        "components",
        ("fedhp.models", "fedhp.data", "fedhp.privacy", "fedhp.plugins"),
        "batched models and their execution policy; datasets; privacy; plugin loading",
    ),
    (
        "utilities",
        (
            "fedhp.registry",
            "fedhp.robust",
            "fedhp.topology",
            "fedhp.reporting",
            "fedhp.tensorboard",
            "fedhp.mlflow_tracking",
        ),
        "registries; robust options; the cloud-edge-client tree; results files, TensorBoard, "
        "MLflow",
    ),
    (
        "foundation",
        ("fedhp.errors", "fedhp.version", "fedhp.tables", "fedhp.comm"),
        "errors; the version; tables of results; messages on the wire and their ledger",
    ),
)
"""The layers, top first: a module may import the modules of its own package (``fedhp.X``) and of
any layer below its own; docs/architecture.md draws exactly this (:func:`picture`)."""

UPWARD: dict[tuple[str, str], str] = {
    ("fedhp.config", "fedhp.unread"): "resolving a configuration needs the components",
}
"""The arrows that run back up (importer's package, imported package) and why; each is named in
docs/architecture.md."""


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` (0 = top) of the layer holding ``module`` (``fedhp`` stands
    for the package's face alone: a module of its own must be placed)."""
    best, index = "", -1
    for i, (_, members, _) in enumerate(LAYERS):
        for member in members:
            inside = module == member or (member != "fedhp" and module.startswith(member + "."))
            if inside and len(member) > len(best):
                best, index = member, i
    if index < 0:
        raise AssertionError(f"{module}: in no layer; add it to LAYERS and docs/architecture.md")
    return index


def unit_of(module: str) -> str:
    """The package or top-level module that ``module`` belongs to (``fedhp.engine.ops`` ->
    ``fedhp.engine``; the package ``fedhp`` itself stays ``fedhp``)."""
    return ".".join(module.split(".")[:2])


def module_name(path: Path) -> str:
    """``src/fedhp/engine/ops.py`` -> ``fedhp.engine.ops``; a package's ``__init__.py`` -> the
    package."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> Iterator[tuple[str, int]]:
    """Every fedhp module that ``path`` imports, with the line: import statements anywhere in the
    file and ``importlib.import_module`` calls with a literal name."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        else:
            continue
        for name in names:
            if name == "fedhp" or name.startswith("fedhp."):
                yield name, node.lineno


def sources() -> list[Path]:
    return sorted((SRC / "fedhp").rglob("*.py"))


def arrows() -> Iterator[tuple[Path, int, str, str]]:
    """(file, line, importer, imported) for every import that leaves the importer's package."""
    for path in sources():
        importer = module_name(path)
        for imported, line in imports_of(path):
            if unit_of(imported) != unit_of(importer):
                yield path, line, importer, imported


def picture() -> str:
    """The layer picture of docs/architecture.md, drawn from :data:`LAYERS`."""
    lines = []
    for i, (name, members, what) in enumerate(LAYERS):
        number = len(LAYERS) - i
        lines.append(f"{number:>2} {name:<12}{', '.join(members)}")
        lines.append(f"   {'':<12}  {what}")
    return "\n".join(lines)


def test_every_module_is_in_a_layer() -> None:
    for path in sources():
        layer_of(module_name(path))


def test_each_module_imports_only_its_package_and_the_layers_below() -> None:
    wrong = []
    for path, line, importer, imported in arrows():
        up = layer_of(imported) <= layer_of(importer)
        if up and (unit_of(importer), unit_of(imported)) not in UPWARD:
            wrong.append(
                f"{path.relative_to(ROOT)}:{line}: {importer} ({LAYERS[layer_of(importer)][0]}) "
                f"imports {imported} ({LAYERS[layer_of(imported)][0]}), not below it"
            )
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("arrow", sorted(UPWARD))
def test_each_arrow_back_up_is_still_there_and_named_in_the_doc(arrow: tuple[str, str]) -> None:
    importer, imported = arrow
    used = {(unit_of(a), unit_of(b)) for _, _, a, b in arrows()}
    assert arrow in used, f"{importer} -> {imported} is gone: drop it from UPWARD and the doc"
    assert f"`{importer}` → `{imported}`" in DOC.read_text(), f"docs/architecture.md: name {arrow}"


def test_the_doc_draws_the_layers() -> None:
    assert picture() in DOC.read_text(), "docs/architecture.md's picture, as LAYERS draws it:\n" + (
        picture()
    )
