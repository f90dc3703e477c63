"""Lightning's ``accumulate_grad_batches`` under ``HeteroStrategy``: one global batch per
optimizer step, run as per-rank micro-batches (see docs/memory.md, the accumulation story)."""

import pytest
import torch

from tests.e2e.launch import run_script

pytestmark = pytest.mark.e2e


def run(tmp_path, kind, *extra):
    out = tmp_path / f"{kind}.pt"
    run_script("accumulate_program.py", str(out), kind, *extra)
    return torch.load(out)


def test_accumulation_steps_as_ddps_and_then_the_plan_follows_a_slow_rank(tmp_path):
    ddp, hetero = run(tmp_path, "ddp"), run(tmp_path, "hetero")
    # the same 32 samples per optimizer step, each rank's 16 in 4 micro-batches of 4: the
    # same parameters after 6 steps as DDP's accumulation
    assert ddp["plans"] == [] and ddp["micro_batches"] == [24, 24]
    assert hetero["plans"][0] == [16, 16] and hetero["micro_batches"] == [24, 24]
    assert hetero["global_step"] == ddp["global_step"] == 6
    for name, value in ddp["state"].items():
        torch.testing.assert_close(hetero["state"][name], value, atol=1e-6, rtol=0)
    assert hetero["accumulate"] == ddp["accumulate"] == 4  # the user's setting, back
    # strategy="hetero" as it comes, rank 1 slowed: its share of the 32 samples shrinks,
    # which Lightning's own accumulation of 4-sample batches could never do
    adaptive = run(tmp_path, "adaptive", "0.01")
    assert adaptive["global_step"] == 16
    assert adaptive["plans"][0] == [16, 16]
    last = adaptive["plans"][-1]
    assert sum(last) == 32 and last[0] > last[1]
    # rank 0's larger share ran in micro-batches of at most the loader batch of 4
    assert adaptive["micro_batches"][0] > adaptive["micro_batches"][1]


def test_plans_change_every_2_steps_while_loader_workers_draw_ahead(tmp_path):
    """The overlapped boundary applies each plan from the step every rank had drawn when it
    sent its report plus the batches trained since: with 2 persistent workers drawing ahead,
    no rank is asked to change a step it has drawn (that raises), and the plan still follows
    the slow rank."""
    adaptive = run(tmp_path, "adaptive_workers", "0.01")
    assert adaptive["global_step"] == 16
    assert adaptive["plans"][0] == [16, 16]
    last = adaptive["plans"][-1]
    assert sum(last) == 32 and last[0] > last[1]
