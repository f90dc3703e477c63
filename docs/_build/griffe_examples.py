"""Griffe extension for the API reference (mkdocs.yml): docstrings' ``Example:`` sections
are doctests, as the package's Google-style docstrings write them; griffe reads the singular
title as an admonition, so its ``>>>`` lines would render as prose. Read them as
``Examples:``, which griffe turns into code blocks. The sources stay as they are."""

import re

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
