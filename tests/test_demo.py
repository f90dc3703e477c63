"""examples/demo.py's printed result: one summary line, the plan history compressed, and where
the accuracy difference is explained (the training itself runs in tests/e2e)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("demo_example", ROOT / "examples" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_repeated_plans_are_collapsed_with_their_count(demo):
    plans = [[32, 32], [20, 44], [20, 44], [20, 44], [21, 43], [20, 44]]
    assert demo.compress(plans) == "[32, 32], [20, 44] x3, [21, 43], [20, 44]"
    assert demo.compress([[27, 27, 20, 54]] * 6) == "[27, 27, 20, 54] x6"
    assert demo.compress([]) == ""


def test_the_summary_is_one_line_without_a_trailing_separator(demo):
    line = demo.summary_line(1.8234, 2.0, [24, 24, 16, 64])
    assert line == (
        "speedup 1.82x per epoch (ideal 2.00x, with the speed-proportional split [24, 24, 16, 64])"
    )
    assert "\n" not in line and not line.endswith(";")


def test_the_accuracy_note_points_to_a_faq_question_that_exists(demo):
    faq = (ROOT / "docs" / "faq.md").read_text()
    question = demo.ACCURACY_NOTE.split("docs/faq.md, '")[1].rstrip("'")
    assert f"## {question}" in faq
