"""MkDocs hooks (mkdocs.yml): the pages are written as GitHub renders Markdown, so that they
read the same on GitHub and on the site.

- ``--8<-- "PATH"`` alone on a line includes a file of the repository (PATH relative to
  mkdocs.yml): docs/benchmark-results.md is BENCHMARKS.md.
- Python-Markdown needs a blank line between a paragraph and a list or a fence, and nested
  list items indented by 4 spaces; GitHub takes neither. Both are added outside fences.
"""

import re
from pathlib import Path

_INCLUDE = re.compile(r'^--8<-- "([^"]+)"\s*$', re.MULTILINE)
_ITEM = re.compile(r"^(- |\* |\d+\. )")


def github_lists(markdown: str) -> str:
    """``markdown`` with the blank lines and nested indentation Python-Markdown needs."""
    out: list[str] = []
    fence = in_list = nested = False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            if not fence and out and out[-1].strip() and not in_list:
                out.append("")
            fence = not fence
        elif fence:
            pass
        elif _ITEM.match(line) and (
            in_list
            or not _ITEM.match(line).group(1)[0].isdigit()
            or line.startswith("1. ")
            or not (out and out[-1].strip())
        ):
            # as GitHub: only a bullet or "1." interrupts a paragraph ("2. ..." there is text)
            if out and out[-1].strip() and not in_list:
                out.append("")
            in_list, nested = True, False
        elif not line.strip():
            in_list = nested = False
        elif in_list and re.match(r"^ {2,3}(- |\* |\d+\. )", line):
            line, nested = "    " + line.lstrip(), True
        elif nested and line.startswith("    "):
            line = "  " + line
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    root = Path(config["config_file_path"]).parent

    def include(match: re.Match) -> str:
        return (root / match.group(1)).read_text(encoding="utf-8")

    return github_lists(_INCLUDE.sub(include, markdown))
