"""The ``bench`` extra: what the benchmark commands need beyond the library.

``python -m lightning_hetero.bench`` and ``python -m lightning_hetero.bench.mps`` call
``exit_without_extra`` before they import anything from the extra, so that a core
install answers with what to install instead of a traceback. Standard library only.
"""

import importlib.util
import sys

__all__ = ["INSTALL", "REQUIRED", "exit_without_extra", "missing"]

#: What the commands import, as distribution name -> top-level module.
REQUIRED = {"scikit-learn": "sklearn", "tqdm": "tqdm", "torchmetrics": "torchmetrics"}
INSTALL = "pip install 'lightning_hetero[bench]'"


def missing() -> list[str]:
    """The distributions of ``REQUIRED`` whose module cannot be found."""
    return [dist for dist, module in REQUIRED.items() if importlib.util.find_spec(module) is None]


def exit_without_extra(prog: str) -> None:
    """Exit with status 2 and what to install when part of the extra is missing (``--help``
    needs none of it: it prints the usage and what the runs will need)."""
    absent = missing()
    if absent and {"-h", "--help"} & set(sys.argv[1:]):
        print(
            f"note: the runs of {prog} need the bench extra ({INSTALL}).",
            file=sys.stderr,
        )
        return
    if absent:
        names = " and ".join(absent)
        print(
            f"{prog} needs the bench extra: {names} {'is' if len(absent) == 1 else 'are'}"
            " not installed here."
            f" Install the extra with: {INSTALL}"
            " (the library itself, HeteroStrategy and lightning_hetero.planning, needs none"
            " of it).",
            file=sys.stderr,
        )
        sys.exit(2)
