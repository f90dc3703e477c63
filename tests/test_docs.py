"""The documentation says what the code has: every option of the strategies is documented, and
the README's links lead somewhere. (`make docs` builds the site with `--strict`, which checks
the links and anchors between the pages and the docstrings of the API reference.)"""

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_hetero import HeteroFSDPStrategy, HeteroStrategy
from lightning_hetero.modes import MODES
from lightning_hetero.planning.registry import CONTROLLERS
from tests.conftest import MAKE_TEST_MARKERS

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


def test_the_compatibility_page_is_what_the_matrix_tests_case_table_renders() -> None:
    """docs/compatibility.md is generated from tests/e2e/compat_cases.py (issue 40): rewrite it
    with ``python -m tests.e2e.compat_cases`` after changing the table."""
    from tests.e2e.compat_cases import CASES, render_markdown

    page = (DOCS / "compatibility.md").read_text(encoding="utf-8")
    assert len(CASES) >= 60
    assert page == render_markdown(), "run `python -m tests.e2e.compat_cases` to rewrite it"


# ---------------------------------------------------------------- one place for the numbers
_COUNT = re.compile(r"\b(\d{1,3}(?:,\d{3})+|\d{3,}) tests\b")


def _pages() -> dict[str, str]:
    """The pages people read: the README, the Makefile's comments, BENCHMARKS.md, docs/."""
    paths = [REPO / "README.md", REPO / "Makefile", REPO / "BENCHMARKS.md"]
    paths += sorted(DOCS.rglob("*.md"))
    return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in paths}


def _collected_by_make_test(config: pytest.Config) -> int | None:
    """What ``make test`` collects: this session's count where it is that run (see
    tests/conftest.py), else pytest's own collection of it in a subprocess, where this
    session was asked for particular tests; ``None`` in another whole-suite run
    (``make test-oldest``, another marker expression)."""
    counted = getattr(config, "make_test_count", None)
    if counted is not None:
        return int(counted)
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        return None
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-m", MAKE_TEST_MARKERS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    found = re.search(r"^(\d+)(?:/\d+)? tests? collected", proc.stdout, re.MULTILINE)
    assert found, proc.stdout[-2000:] + proc.stderr[-2000:]
    return int(found.group(1))


def test_the_test_count_is_stated_once_and_is_what_make_test_collects(request) -> None:
    stated = {page: counts for page, text in _pages().items() if (counts := _COUNT.findall(text))}
    assert list(stated) == ["docs/times.md"] and len(stated["docs/times.md"]) == 1, (
        f"a test count belongs in docs/times.md only (once); found {stated}"
    )
    count = int(stated["docs/times.md"][0].replace(",", ""))
    collected = _collected_by_make_test(request.config)
    if collected is None:
        pytest.skip("this run selects other tests than `make test`")
    assert count == collected, (
        f"docs/times.md says `make test` collects {count:,} tests; it collects {collected:,}:"
        f" write **{collected:,} tests** there"
    )


def test_every_named_controller_and_mode_is_in_the_options_table() -> None:
    # issue 43: the `controller` row left out "model"
    rows = {
        name: row
        for name, row in re.findall(
            r"^\| `(\w+)` \|(.*)$", (DOCS / "options.md").read_text(encoding="utf-8"), re.M
        )
    }
    missing = [f'controller="{n}"' for n in CONTROLLERS if f'`"{n}"`' not in rows["controller"]]
    missing += [f'mode="{n}"' for n in MODES if f'`"{n}"`' not in rows["mode"]]
    assert not missing, f"docs/options.md's rows leave out {missing}"


def test_every_row_of_the_options_table_is_an_option() -> None:
    from lightning.pytorch.strategies import DDPStrategy

    ddp = inspect.signature(DDPStrategy.__init__).parameters  # the row of DDP's, passed on
    options = {*_keyword_only(HeteroStrategy), *_keyword_only(HeteroFSDPStrategy), *ddp}
    stale = sorted(_table_options(DOCS / "options.md") - options)
    assert not stale, f"docs/options.md has rows for options the strategies do not take: {stale}"


def test_option_names_in_tables_do_not_break_mid_word() -> None:
    # Material's `.md-typeset code { word-break: break-word }` cut the Options table's names
    css = "".join((DOCS / p).read_text() for p in re.findall(r"- (css/\S+)", _mkdocs()))
    rule = re.search(r"table:not\(\[class\]\) td:first-child code \{([^}]*)\}", css)
    assert rule and "white-space: nowrap" in rule.group(1), "extra_css lost the rule"


def test_the_home_pages_code_fits_the_page() -> None:
    # a code block's line longer than this runs off the edge of the page's column (it scrolls)
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```\w*\n(.*?)^```", text, re.M | re.S)
    long = [line for block in blocks for line in block.splitlines() if len(line) > 80]
    assert blocks and not long, long


def _mkdocs() -> str:
    return (REPO / "mkdocs.yml").read_text(encoding="utf-8")
