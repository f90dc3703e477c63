"""Docstrings as plain text where they are read at run time (LightningCLI's ``--help``).

The docstrings are Markdown for the API reference, which reads them from the source. At run
time jsonargparse prints a class's ``__doc__`` in ``--help``, where code spans and links
showed as written, backticks and brackets included. ``plain_docstring`` rewrites a class's
``__doc__`` (its doctest examples left as they are): code spans lose their backticks, a
cross-reference keeps its text and a link names its page.
"""

import re
from typing import TypeVar

__all__ = ["plain_docstring", "plain_text"]

# a cross-reference `[text][path]`, a link `[text](target)`, a code span, bold
_MARKUP = re.compile(
    r"\[([^\]]+)\]\[[\w.]*\]"
    r"|\[([^\]]+)\]\(([^)\s]+)\)"
    r"|``(.+?)``"
    r"|`([^`\n]+)`"
    r"|\*\*(\S(?:.*?\S)?)\*\*",
    re.DOTALL,
)
_PAGE = re.compile(r"^(?:\.\./)*([\w-]+\.md)(#[\w-]+)?$")


def _plain(match: re.Match) -> str:
    xref, text, target, code2, code1, bold = match.groups()
    if xref is not None:
        return plain_text(xref)
    if text is not None:
        page = _PAGE.match(target)
        where = f"docs/{page.group(1)}" if page else target
        return f"{plain_text(text)} ({where})"
    return next(group for group in (code2, code1, bold) if group is not None)


def plain_text(markdown: str) -> str:
    """``markdown`` without its inline markup; doctest examples (from a ``>>>`` line to the
    next blank line) are left as they are.

    Examples:
        >>> plain_text('``"bsp"`` (see [Training modes](../modes.md#modes))')
        '"bsp" (see Training modes (docs/modes.md))'
        >>> plain_text("a [`Controller`][lightning_hetero.planning.Controller], **not** `x`")
        'a Controller, not x'
    """
    out: list[str] = []
    prose: list[str] = []
    example = False
    for line in markdown.split("\n"):
        if line.lstrip().startswith(">>>"):
            example = True
        elif not line.strip():
            example = False
        if example:
            if prose:
                out.append(_MARKUP.sub(_plain, "\n".join(prose)))
                prose = []
            out.append(line)
        else:
            prose.append(line)
    if prose:
        out.append(_MARKUP.sub(_plain, "\n".join(prose)))
    return "\n".join(out)


_Class = TypeVar("_Class", bound=type)


def plain_docstring(cls: _Class) -> _Class:
    """Give ``cls`` (returned: a class decorator) its docstring as plain text
    (``plain_text``)."""
    if cls.__doc__:
        cls.__doc__ = plain_text(cls.__doc__)
    return cls
