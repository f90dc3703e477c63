"""A map-style dataset resumed from a mid-epoch checkpoint trains every sample once per epoch."""

import json

from tests.e2e.launch import run_script
from tests.e2e.resume_program import CHANGE_AT, CHANGED, PLAN, SAMPLES


def _run(tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    run_script("resume_program.py", str(out), str(tmp_path / "ckpt"), *extra, timeout=240)
    return json.loads(out.read_text())["seen"]


def _trained(seen, epoch):
    """The samples both ranks trained in ``epoch``, one entry per time trained."""
    return [i for rows in seen for e, _, *samples in rows if e == epoch for i in samples]


def test_a_mid_epoch_checkpoint_resumes_every_sample_once_per_epoch(tmp_path):
    whole = _run(tmp_path, "whole")
    # a checkpoint from the validation in the middle of epoch 0, after the plan change
    # was scheduled and before it applied
    (checkpoint,) = (tmp_path / "ckpt").glob("epoch=0-step=3.ckpt")
    resumed = _run(tmp_path, "resumed", "--resume", str(checkpoint))
    before = [[row for row in rows if row[:2] < [0, 3]] for rows in whole]
    for epoch in (0, 1):
        across = _trained(before, epoch) + _trained(resumed, epoch)
        assert sorted(across) == list(range(SAMPLES))
        assert sorted(_trained(whole, epoch)) == list(range(SAMPLES))
    # the resumed epoch went on with the same batches, the scheduled plan change included
    assert [row for rows in resumed for row in rows if row[0] == 0] == [
        row for rows in whole for row in rows if row[:2] >= [0, 3] and row[0] == 0
    ]
    sizes = {(e, s): len(samples) for e, s, *samples in resumed[0]}
    assert sizes[(0, 3)] == PLAN[0] and sizes[(0, CHANGE_AT)] == CHANGED[0]
