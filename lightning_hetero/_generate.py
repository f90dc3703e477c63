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

It first writes the public declaration of the modes' part options (``modes.OPTION_GROUPS``)
from their fields: each one's keyword in ``HeteroStrategy.__init__`` (type and default as
the field has them), its entry in the class docstring and its row in ``docs/options.md``
(its field's docstring); ``option_declarations``. So a new part option is its field, its
check and its use; ``tests/test_namespaces.py`` fails when a declaration is stale.

usage: python -m lightning_hetero._generate [--out DIR]
"""

import argparse
import ast
import re
import textwrap
from dataclasses import dataclass, fields
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


# ---------------------------------------------------------------- the part options' declarations
STRATEGY = ROOT / "strategy.py"
OPTIONS_PAGE = ROOT.parent / "docs" / "options.md"
_GROUPS_SOURCE = ROOT / "modes" / "base.py"
# an entry of the strategy's docstring (`name: text`, continued 4 columns further in), a
# keyword of its signature (one line each), a row of the options table
_DOC_ENTRY, _DOC_MORE = re.compile(r"^ {8}(\w+): "), re.compile(r"^ {12}\S")
_KEYWORD = re.compile(r"^ {8}(\w+): .* = .*,$")
_ROW = re.compile(r"^\| `(\w+)` \|")
_UP = re.compile(r"\]\((?:\.\./)+")
_CODE = re.compile(r"`[^`]+`")


@dataclass(frozen=True)
class PartOption:
    """One field of an option group, as its source declares it."""

    name: str
    annotation: str  # the type, as written
    default: str  # the default, as written
    doc: str  # its docstring as one paragraph (Markdown, links relative to the API pages)


def part_options() -> list[PartOption]:
    """The fields of ``modes.OPTION_GROUPS``, group by group, read from their source: each
    must be ``name: type = option(default, example=...)`` followed by its docstring."""
    from lightning_hetero.modes import OPTION_GROUPS

    source = _GROUPS_SOURCE.read_text(encoding="utf-8")
    classes = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}
    found = []
    for group in OPTION_GROUPS:
        body = classes[group.__name__].body
        declared = []
        for node, after in zip(body, [*body[1:], None]):
            if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
                continue
            annotation = ast.get_source_segment(source, node.annotation) or ""
            if annotation.startswith("ClassVar"):
                continue
            name, value = node.target.id, node.value
            where = f"{group.__name__}.{name} ({_GROUPS_SOURCE.name}, line {node.lineno})"
            is_option = (
                isinstance(value, ast.Call)
                and getattr(value.func, "id", None) == "option"
                and len(value.args) == 1
            )
            if not is_option:
                raise ValueError(f"{where} must be declared as `option(default, example=...)`.")
            docstring = after.value.value if isinstance(after, ast.Expr) else None
            if not isinstance(docstring, str):
                raise ValueError(f"{where} needs its docstring on the lines under it.")
            default = ast.get_source_segment(source, value.args[0]) or ""
            found.append(PartOption(name, annotation, default, " ".join(docstring.split())))
            declared.append(name)
        if declared != [f.name for f in fields(group)]:
            raise ValueError(f"{group.__name__}'s fields are not all `option(...)` declarations.")
    return found


def _replace_entries(
    text: str,
    entry: re.Pattern[str],
    more: re.Pattern[str] | None,
    names: set[str],
    new: list[str],
    where: str,
) -> str:
    """``text`` with its entries of ``names`` (lines matching ``entry``, each with the lines
    after it matching ``more``) replaced by ``new``; they must stand together."""
    lines = text.split("\n")
    spans, i = [], 0
    while i < len(lines):
        match, end = entry.match(lines[i]), i + 1
        while match and more is not None and end < len(lines) and more.match(lines[end]):
            end += 1
        spans.append((match.group(1) if match else None, i, end))
        i = end
    ours = [k for k, (name, _, _) in enumerate(spans) if name in names]
    if not ours or ours != list(range(ours[0], ours[-1] + 1)):
        raise ValueError(
            f"{where}: the part options' entries must stand together, in one block, for"
            f" `{COMMAND}` to rewrite them."
        )
    start, end = spans[ours[0]][1], spans[ours[-1]][2]
    return "\n".join(lines[:start] + new + lines[end:])


def option_declarations() -> dict[Path, str]:
    """``strategy.py`` and ``docs/options.md`` with the part options' keywords, docstring
    entries and table rows written from their fields (``part_options``)."""
    options = part_options()
    strategy = STRATEGY.read_text(encoding="utf-8")
    head, signature = strategy.split("    def __init__(", 1)
    # a code span stays on one line (its spaces held by a mark while the text is wrapped):
    # LightningCLI's help shows a span broken over two lines as written (``plain_docstring``)
    held = [
        _CODE.sub(lambda m: m.group().replace(" ", "\0"), f"{o.name}: {o.doc}") for o in options
    ]
    entries = [
        textwrap.fill(
            text,
            width=100,
            initial_indent=" " * 8,
            subsequent_indent=" " * 12,
            break_long_words=False,
            break_on_hyphens=False,
        ).replace("\0", " ")
        for text in held
    ]
    keywords = [f"        {o.name}: {o.annotation} = {o.default}," for o in options]
    # the table's links are relative to docs/, the docstrings' to the API pages below it
    rows = [f"| `{o.name}` | `{o.default}` | {_UP.sub('](', o.doc)} |" for o in options]
    page = OPTIONS_PAGE.read_text(encoding="utf-8")
    names = {o.name for o in options}
    return {
        STRATEGY: _replace_entries(head, _DOC_ENTRY, _DOC_MORE, names, entries, "the docstring")
        + "    def __init__("
        + _replace_entries(signature, _KEYWORD, None, names, keywords, "the signature"),
        OPTIONS_PAGE: _replace_entries(page, _ROW, None, names, rows, OPTIONS_PAGE.name),
    }


def write_option_declarations() -> list[Path]:
    """Write ``option_declarations`` where they differ; returns the paths written."""
    written = []
    for path, text in option_declarations().items():
        if path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
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
    for path in [*write_option_declarations(), *generate(args.out)]:
        print(path)


if __name__ == "__main__":
    main()
