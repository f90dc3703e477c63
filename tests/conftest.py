import os

# Several gloo ranks share two cores in the end-to-end tests.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Property tests: reproducible (derandomized) and without per-example deadlines, which
# shared CI cores would trip. HYPOTHESIS_PROFILE=thorough draws more examples.
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# ---------------------------------------------------------------- order and markers
# Everything under tests/e2e launches real multi-process training: marked `e2e`, which
# `make test` leaves to `make test-e2e` (CI runs both). Unit tests and doctests run first,
# so a run shows progress from its first minute.
_SLOW_DIRS = ("e2e", "upstream")


def _group(item: pytest.Item) -> int:
    parts = item.path.parts
    if "tests" not in parts:
        return 1  # doctests of lightning_hetero
    sub = parts[parts.index("tests") + 1 :]
    return 2 if sub and sub[0] in _SLOW_DIRS else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _group(item) == 2 and item.path.parts[-2] == "e2e":
            item.add_marker(pytest.mark.e2e)
    items.sort(key=_group)  # stable: each file keeps its order


#: ``make test``'s marker expression (the Makefile's); docs/times.md states its test count.
MAKE_TEST_MARKERS = "not slow and not multinode and not e2e and not ray"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Note how many tests this session runs when it is ``make test``'s whole selection
    (``config.make_test_count``, else ``None``), which tests/test_docs.py compares with the
    count docs/times.md states, without collecting again."""
    config = session.config
    option = config.option
    whole = (
        config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and option.markexpr == MAKE_TEST_MARKERS
        and not option.keyword
        and not option.deselect
        and not option.ignore_glob
        and not getattr(option, "lf", False)
        and not getattr(option, "failedfirst", False)
    )
    config.make_test_count = len(session.items) if whole else None  # type: ignore[attr-defined]
