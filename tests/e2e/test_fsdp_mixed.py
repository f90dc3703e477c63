"""An HF-style model sharded as one unit, in bf16 mixed precision: the timing sees the slow rank."""

import json

import pytest

from tests.e2e.fsdp_mixed_program import BATCH, COSTS
from tests.e2e.launch import run_script


@pytest.mark.parametrize("variant", ["autocast", "policy"])
def test_an_hf_style_model_in_bf16_mixed_sees_its_throttled_rank(tmp_path, variant):
    out = tmp_path / "out.json"
    run_script("fsdp_mixed_program.py", str(out), variant, timeout=480)
    result = json.loads(out.read_text())
    history = result["history"]
    uniform = [entry for entry in history if entry["batch_sizes"] == [BATCH, BATCH]]
    assert uniform, history
    # at the uniform plan rank 1 sleeps COSTS[1] * BATCH s more per step: its measured
    # compute holds that, and rank 0 spends it waiting inside FSDP's collectives
    for entry in uniform:
        compute, wait = entry["compute_times"], entry["wait_times"]
        assert compute[1] - compute[0] > 0.5 * COSTS[1] * BATCH, history
        assert wait[0] - wait[1] > 0.5 * COSTS[1] * BATCH, history
    # so the plan moves work to the fast rank
    assert result["batch_sizes"][0] > BATCH > result["batch_sizes"][1], history
