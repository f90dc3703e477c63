"""Rewrite the package's docstrings from Sphinx roles to Markdown the API reference renders.

    python tools/docstring_roles.py site/objects.inv      # after `make docs` (any build)

In the docstrings (string statements: module, class, function and attribute docstrings, and
``#:`` attribute comments) of
``lightning_hetero/**/*.py`` (the generated twins left out: run ``make generate`` after):

- ``:class:`~a.b.C``` (also ``:func:``, ``:meth:``, ``:data:``, ``:mod:``, ``:attr:``,
  ``:obj:``, ``:exc:``) becomes an autorefs cross-reference ``[`C`][a.b.C]`` when the object
  is in the site's inventory (``objects.inv``: what the API pages render; a bare or relative
  name is looked up from its module, then as a unique suffix), else code: ``C``;
- ``text::`` ending a line (reST's literal-block marker) becomes ``text:`` (the indented
  block after it is a Markdown code block already);
- ````docs/NAME.md```` becomes a link to that guide, ``[Title](../NAME.md)``, titled as in
  mkdocs.yml's nav (the API pages are one folder below docs/).

A line the longer references push past 100 characters is broken at a space, the rest indented
as the paragraph continues. Idempotent: a second run changes nothing.
"""

import ast
import re
import sys
import zlib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_hetero"
ROLE = re.compile(r":(?:py:)?(class|func|meth|data|mod|attr|obj|exc):`(~?)([^`]+)`")
LITERAL = re.compile(r"(\S)::[ \t]*$", re.MULTILINE)
DOC_PATH = re.compile(r"``docs/([a-z0-9-]+)\.md``")


def inventory(path: Path) -> set[str]:
    """The object names of a Sphinx inventory (version 2), as mkdocstrings writes it."""
    data = path.read_bytes()
    body = data.split(b"\n", 4)[4]
    lines = zlib.decompress(body).decode().splitlines()
    return {line.split(" ", 1)[0] for line in lines if line.strip()}


def guide_titles() -> dict[str, str]:
    """``name.md`` -> its title in mkdocs.yml's nav."""
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    titles: dict[str, str] = {}

    def walk(items: list) -> None:
        for item in items:
            if isinstance(item, dict):
                for title, value in item.items():
                    if isinstance(value, list):
                        walk(value)
                    else:
                        titles[value] = title

    walk(config["nav"])
    return titles


def resolve(target: str, module: str, names: set[str]) -> str | None:
    target = target.strip().removesuffix("()")
    bare = target.lstrip(".")
    candidates = [target, f"{module}.{bare}", f"{module.rsplit('.', 1)[0]}.{bare}"]
    candidates.append(f"lightning_hetero.{bare}")
    for name in candidates:
        if name in names:
            return name
    suffix = [name for name in names if name.endswith("." + bare.split(".", 1)[-1])]
    tail = [name for name in suffix if name.endswith("." + bare)]
    return tail[0] if len(tail) == 1 else None


def convert(text: str, module: str, names: set[str], titles: dict[str, str]) -> str:
    def role(match: re.Match) -> str:
        _, short, target = match.groups()
        explicit = re.fullmatch(r"(.*?)\s*<([^>]+)>", target)
        label, target = explicit.groups() if explicit else (None, target)
        target = target.removesuffix("()")
        shown = label or (target.rsplit(".", 1)[-1] if short else target.lstrip("."))
        found = resolve(target, module, names)
        return f"[`{shown}`][{found}]" if found else f"``{shown}``"

    def guide(match: re.Match) -> str:
        page = f"{match.group(1)}.md"
        return f"[{titles.get(page, page)}](../{page})" if page in titles else match.group(0)

    return DOC_PATH.sub(guide, LITERAL.sub(r"\1:", ROLE.sub(role, text)))


WIDTH = 100
_ITEM = re.compile(r"^(\s*)([*-] |\w[\w*]*( \([^)]*\))?: )")


def wrap(lines: list[str]) -> list[str]:
    """Lines over ``WIDTH`` broken at their last space that fits (docstring prose)."""
    out: list[str] = []
    for i, line in enumerate(lines):
        body = line.rstrip("\n")
        while len(body) > WIDTH and " " in body.strip():
            indent = len(body) - len(body.lstrip())
            cut = body.rfind(" ", indent + 1, WIDTH + 1)
            if cut <= indent:
                break
            after = lines[i + 1] if i + 1 < len(lines) else ""
            item = _ITEM.match(body)
            continues = after.strip() and not _ITEM.match(after)
            if continues and len(after) - len(after.lstrip()) > indent:
                rest_indent = len(after) - len(after.lstrip())  # the paragraph goes on there
            elif item and item.group(2)[0] in "*-":
                rest_indent = indent + 2
            elif item and indent >= 8:  # an Args-style item
                rest_indent = indent + 4
            else:
                rest_indent = indent
            out.append(body[:cut] + "\n")
            body = " " * rest_indent + body[cut + 1 :]
        out.append(body + ("\n" if line.endswith("\n") else ""))
    return out


def rewrite(path: Path, names: set[str], titles: dict[str, str]) -> bool:
    source = path.read_text()
    relative = path.relative_to(ROOT).with_suffix("")
    module = ".".join(relative.parts).removesuffix(".__init__")
    lines = source.splitlines(keepends=True)
    spans = [
        (node.lineno - 1, node.end_lineno)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    ]
    # Sphinx's attribute comments (``#: ...``) too
    spans += [(i, i + 1) for i, line in enumerate(lines) if line.lstrip().startswith("#:")]
    for start, end in sorted(spans, reverse=True):  # from the end: wrapping adds lines
        old = "".join(lines[start:end])
        new = convert(old, module, names, titles)
        if new != old:
            lines[start:end] = wrap(new.splitlines(keepends=True))
    new = "".join(lines)
    if new != source:
        path.write_text(new)
    return new != source


def main() -> None:
    names = inventory(Path(sys.argv[1]))
    titles = guide_titles()
    for path in sorted(PACKAGE.rglob("*.py")):
        if "pytorch_lightning" in path.relative_to(PACKAGE).parts:
            continue
        if rewrite(path, names, titles):
            print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
