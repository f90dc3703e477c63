"""The documentation says what the code has: every option of the strategies is documented, and
the README's links lead somewhere. (`make docs` builds the site with `--strict`, which checks
the links and anchors between the pages and the docstrings of the API reference.)"""

import ast
import inspect
import re
from pathlib import Path

from lightning_hetero import HeteroFSDPStrategy, HeteroStrategy

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def _keyword_only(cls: type) -> list[str]:
    parameters = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in parameters if p.kind is p.KEYWORD_ONLY]


def _table_options(page: Path) -> set[str]:
    """The options named in the first column of the page's tables: ``| `name` | ...``."""
    text = page.read_text(encoding="utf-8")
    return set(re.findall(r"^\| `(\w+)`", text, re.MULTILINE))


def test_every_strategy_option_is_in_the_options_table() -> None:
    documented = _table_options(DOCS / "options.md")
    options = [*_keyword_only(HeteroStrategy), "timeout"]
    assert len(options) > 15  # the signature was read, not an empty one
    missing = [name for name in options if name not in documented]
    assert not missing, f"docs/options.md has no row for {missing}"


def test_every_sharded_option_is_documented() -> None:
    documented = _table_options(DOCS / "options.md")
    fsdp_page = (DOCS / "fsdp.md").read_text(encoding="utf-8")
    missing = [
        name
        for name in _keyword_only(HeteroFSDPStrategy)
        if name not in documented and f"`{name}`" not in fsdp_page
    ]
    assert not missing, f"neither docs/fsdp.md nor docs/options.md documents {missing}"


def test_the_readme_links_to_files_that_exist() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if "://" not in t]
    assert "docs/demo.png" in local and "docs/index.md" in local
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_docstrings_hold_no_sphinx_roles_or_literal_markers():
    # the API reference renders Markdown: `:class:` and a line ending in `::` would show as
    # written (tools/docstring_roles.py converts them); messages and code may still say `::`
    role = re.compile(r":(?:py:)?(?:class|func|meth|data|mod|attr|obj|exc):`")
    found = []
    for path in sorted((REPO / "lightning_hetero").rglob("*.py")):
        source = path.read_text()
        docs = [
            node.value.value
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        ]
        docs += [line for line in source.splitlines() if line.lstrip().startswith("#:")]
        for text in docs:
            if isinstance(text, str) and (role.search(text) or re.search(r"\S::\s*$", text, re.M)):
                found.append(f"{path.relative_to(REPO)}: {text.strip().splitlines()[0][:60]}")
    assert found == []
