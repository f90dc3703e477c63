"""LightningCLI's help shows the strategies' and controllers' docstrings as plain text."""

import inspect
import re

import pytest

from lightning_hetero import HeteroFSDPStrategy, HeteroStrategy
from lightning_hetero._docstrings import plain_text
from lightning_hetero.planning.registry import CONTROLLERS

jsonargparse = pytest.importorskip("jsonargparse")

_MARKUP = re.compile(r"`|\]\(|\]\[|\*\*")


def _help(cls: type) -> str:
    """``--help`` of ``cls``'s arguments as LightningCLI prints them (jsonargparse)."""
    parser = jsonargparse.ArgumentParser()
    parser.add_class_arguments(cls, "strategy")
    return parser.format_help()


def _entries(text: str) -> dict[str, str]:
    """Each ``--strategy.NAME`` option's help in ``text``, by NAME."""
    parts = re.split(r"^  --strategy\.(\w+)\b", text, flags=re.M)
    return {name: body for name, body in zip(parts[1::2], parts[2::2])}


@pytest.mark.parametrize("cls", [HeteroStrategy, HeteroFSDPStrategy])
def test_the_strategies_help_has_no_markdown(cls):
    # issue 43: ``"bsp"``, [`Controller`][lightning_hetero.planning.Controller] and
    # [Training modes](../modes.md) showed as written (the options passed on to
    # DistributedDataParallel keep torch's own docstrings)
    entries = _entries(_help(cls))
    ours = [p.name for p in inspect.signature(cls).parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert "mode" in ours and "mode" in entries
    marked = {name: entries[name] for name in ours if _MARKUP.search(entries.get(name, ""))}
    assert not marked, marked
    assert '"proportional"' in _help(HeteroStrategy)  # the docstring is there, plain


def test_the_controllers_docstrings_are_plain_and_keep_their_examples():
    for cls in CONTROLLERS.values():
        doc = cls.__doc__ or ""
        prose = "\n".join(
            line for line in doc.splitlines() if line.lstrip()[:3] not in (">>>", "...")
        )
        assert not _MARKUP.search(prose.split(">>>")[0]), cls.__name__
    assert ">>>" in (CONTROLLERS["proportional"].__doc__ or "")  # doctests still collected


def test_plain_text_leaves_doctest_examples_as_they_are():
    doc = "Uses ``x``.\n\n    >>> f(`a`)\n    '``b``'\n\nThen `y`."
    assert plain_text(doc) == "Uses x.\n\n    >>> f(`a`)\n    '``b``'\n\nThen y."
