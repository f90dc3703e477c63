"""StragglerReport under an unchanged ``strategy="ddp"`` job, through one real 2-rank gloo run
of ``straggler_program.py``: a delay in rank 1's backward only (which DDP's all-reduce spreads
over both ranks' backward wall time) is found and attributed to rank 1, and equal ranks name
no one.

The durations read here are what the timer counts (the property under test), not a speed
criterion: both ranks spin ``BUSY`` seconds a step, and rank 1 spins ``DELAY`` more in its
backward during the first epoch only. Spins hold the thread on any machine load.
"""

import json

from tests.e2e.launch import run_script

BUSY = 0.08  # every rank's forward, each step: long beside the loop's own noisy work
DELAY = 0.1  # rank 1's backward, each step of epoch 0


def test_the_report_names_a_backward_straggler_and_no_one_among_equals(tmp_path):
    out = tmp_path / "history.json"
    run_script(
        "straggler_program.py",
        str(out),
        *("--busy", str(BUSY), "--delay", str(DELAY), "--epochs", "2", "--delay-epochs", "1"),
    )
    slow, equal = json.loads(out.read_text())
    assert slow["epoch"] == 0 and equal["epoch"] == 1, (slow, equal)
    assert slow["pace_setter"] == 1, slow
    fast_s, slow_s = slow["compute_times"]
    # rank 1's compute holds the injected delay plus its real compute (rank 0's: the ranks
    # are equal but for the delay), within 15%
    assert abs(slow_s - (DELAY + fast_s)) <= 0.15 * (DELAY + fast_s), slow
    # rank 0 waited in the all-reduce for rank 1's delay: a wait, not its compute
    assert slow["wait_times"][0] >= 0.5 * DELAY, slow
    assert slow["allowed_speedup"] > 1.5 and slow["plan"][0] > slow["plan"][1], slow
    assert equal["pace_setter"] is None, equal
    assert equal["allowed_speedup"] < 1.2, equal
