"""bench.straggler's ``timer`` path runs here on CPU in a second (a GPU session runs it on CUDA)."""

import json

import pytest

from lightning_hetero.bench import straggler


def test_the_timer_benchmark_times_the_loop_without_with_hooks_and_with_the_whole_timer(
    capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    out = tmp_path / "timer.json"
    argv = ["timer", "--width", "8", "--batch-size", "4", "--steps", "3", "--repeats", "3"]
    straggler.main([*argv, "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [row["repeat"] for row in rows] == [0, 1, 2]
    for row in rows:
        assert row["none_s"] > 0 and row["hooks_s"] > 0 and row["timer_s"] > 0
        assert row["timer_ratio"] == pytest.approx(row["timer_s"] / row["none_s"])
    assert "the whole timer" in capsys.readouterr().out
