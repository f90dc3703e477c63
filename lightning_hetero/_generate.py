"""Write ``lightning_hetero.pytorch_lightning``: the package's Lightning-facing modules, built on
``pytorch_lightning``.

``make generate`` (``python -m lightning_hetero._generate``) writes
``lightning_hetero/pytorch_lightning/<name>.py`` for each module ``<name>`` of
``TWINNED``: ``lightning_hetero/<name>.py`` with the rewrites
of Lightning's own build (``lightning.pytorch`` -> ``pytorch_lightning``, ``lightning.fabric`` ->
``lightning_fabric``) and imports of other twinned modules pointed at their twins. Pure modules
are not copied: both copies import them from ``lightning_hetero``. Each file starts with a
two-line header (``header``), so its line ``N + 2`` is line ``N`` of the source.

The twins are checked in; ``tests/test_namespaces.py`` fails when one is stale, and when a module
that uses Lightning (directly or through a twinned module) is missing from ``TWINNED``
(``lightning_facing``).

usage: python -m lightning_hetero._generate [--out DIR]
"""

import argparse
import ast
import re
from pathlib import Path

from lightning_hetero._namespaces import PACKAGE, TWIN_PACKAGE, TWINNED

ROOT = Path(__file__).resolve().parent
TWIN_DIR = ROOT / "pytorch_lightning"
COMMAND = "make generate"
_LIGHTNING_ROOTS = {"lightning", "pytorch_lightning", "lightning_fabric"}
# left out of the check: the benchmark (it runs its own `lightning` programs), the twins, and
# the engine integrations, built on the copy their engine uses (Ray's is lightning.pytorch
# whenever `lightning`, a dependency of this package, is installed)
_NOT_TWINNABLE = ("bench", "pytorch_lightning", "integrations")
# What Lightning's own build rewrites, plus the top-level `lightning` imports it implies.
_REWRITES = (
    (re.compile(r"\blightning\.pytorch\b"), "pytorch_lightning"),
    (re.compile(r"\blightning\.fabric\b"), "lightning_fabric"),
    (re.compile(r"^(\s*)from lightning import ", re.M), r"\1from pytorch_lightning import "),
    (re.compile(r"^(\s*)import lightning as ", re.M), r"\1import pytorch_lightning as "),
)
_TWINNED_REFERENCE = re.compile(
    rf"\b{PACKAGE}\.({'|'.join(sorted(TWINNED, key=len, reverse=True))})\b"
)


def header(name: str) -> str:
    """The twin's first lines: where it comes from, and no lint or formatting of its own (the
    rewritten imports are out of order and some lines longer; ``make lint`` checks the
    source)."""
    return (
        f"# Generated from {PACKAGE}/{name}.py by `{COMMAND}`; do not edit.  # ruff: noqa\n"
        "# fmt: off\n"
    )


# ---------------------------------------------------------------- imports, from the source
class _RuntimeImports(ast.NodeVisitor):
    """Modules a source imports when it runs (``if TYPE_CHECKING:`` blocks left out unless
    ``type_checking``); ``from lightning_hetero import x`` counts as ``lightning_hetero.x``
    when ``x`` is a submodule, as the package itself otherwise."""

    def __init__(self, type_checking: bool = False) -> None:
        self.type_checking = type_checking
        self.modules: set[str] = set()
        self.relative: list[int] = []

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
        if name == "TYPE_CHECKING" and not self.type_checking:
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.modules.update(alias.name for alias in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.relative.append(node.lineno)
            return
        module = node.module or ""
        if module != PACKAGE:
            self.modules.add(module)
            return
        for alias in node.names:
            submodule = ROOT / alias.name
            is_module = submodule.with_suffix(".py").is_file() or submodule.is_dir()
            self.modules.add(f"{PACKAGE}.{alias.name}" if is_module else PACKAGE)


def runtime_imports(path: Path, type_checking: bool = False) -> _RuntimeImports:
    visitor = _RuntimeImports(type_checking)
    visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return visitor


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def lightning_facing() -> dict[str, str]:
    """The package's modules that need a ``pytorch_lightning`` twin, each with the reason: they
    import Lightning at run time, the package's public names (``from lightning_hetero import
    HeteroStrategy``), or another module that needs one. The package's ``__init__`` (which
    registers the strategies), the benchmark and the twins themselves are left out."""
    paths = {
        _module_name(path): path
        for path in sorted(ROOT.rglob("*.py"))
        if path.relative_to(ROOT).parts[0] not in _NOT_TWINNABLE and path != ROOT / "__init__.py"
    }
    imports = {name: runtime_imports(path).modules for name, path in paths.items()}
    facing = {}
    for name, modules in imports.items():
        lightning = sorted(m for m in modules if m.split(".")[0] in _LIGHTNING_ROOTS)
        if lightning:
            facing[name] = f"imports {', '.join(lightning)}"
        elif PACKAGE in modules:
            facing[name] = f"imports `{PACKAGE}`'s public names"
    changed = True
    while changed:
        changed = False
        for name, modules in imports.items():
            through = sorted(m for m in modules if m in facing and m != name)
            if name not in facing and through:
                facing[name] = f"imports {', '.join(through)}"
                changed = True
    return facing


# ---------------------------------------------------------------- the twins
def twin_source(name: str) -> str:
    """The generated ``lightning_hetero/pytorch_lightning/<name>.py``: the header, then
    ``lightning_hetero/<name>.py`` with its imports rewritten."""
    path = ROOT / f"{name}.py"
    source = path.read_text(encoding="utf-8")
    for pattern, replacement in _REWRITES:
        source = pattern.sub(replacement, source)
    source = _TWINNED_REFERENCE.sub(rf"{TWIN_PACKAGE}.\1", source)
    imports = ast.parse(source, str(path))
    visitor = _RuntimeImports(type_checking=True)
    visitor.visit(imports)
    left = sorted(m for m in visitor.modules if m.split(".")[0] == "lightning")
    problems = []
    if left:
        problems.append(f"imports {left} in a form the rewrite does not know")
    if visitor.relative:
        problems.append(f"uses relative imports (lines {visitor.relative})")
    if PACKAGE in visitor.modules:
        problems.append(f"imports `{PACKAGE}`'s public names")
    if problems:
        raise ValueError(
            f"Cannot generate the pytorch_lightning twin of {PACKAGE}.{name} ({path}): it "
            + "; ".join(problems)
            + ". Twinned modules import `lightning.pytorch...`, `lightning.fabric...` and other"
            f" {PACKAGE} modules by absolute module name."
        )
    return header(name) + source


def generate(out_dir: Path = TWIN_DIR) -> list[Path]:
    """Write every twin into ``out_dir``, and remove twins of modules no longer twinned;
    returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in out_dir.glob("*.py"):
        if path.stem not in TWINNED and path.read_text(encoding="utf-8").startswith("# Generated"):
            path.unlink()
    written = []
    for name in TWINNED:
        target = out_dir / f"{name}.py"
        target.write_text(twin_source(name), encoding="utf-8")
        written.append(target)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=TWIN_DIR, help="default: %(default)s")
    args = parser.parse_args()
    missing = {
        name: why
        for name, why in lightning_facing().items()
        if name.removeprefix(f"{PACKAGE}.") not in TWINNED
    }
    if missing:
        raise SystemExit(
            f"Modules that use Lightning are missing from {PACKAGE}._namespaces.TWINNED:"
            f" {missing}. Add them (sub-packages cannot be twinned: keep Lightning out of them)."
        )
    for path in generate(args.out):
        print(path)


if __name__ == "__main__":
    main()
