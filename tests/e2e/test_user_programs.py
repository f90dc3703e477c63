"""Programs written the way Lightning users write them, on 2 gloo ranks with ``"hetero"``.

Every run keeps Lightning's defaults (progress bar, checkpointing, model summary) and logs a
torchmetrics metric and ``sync_dist=True`` values at epoch and validation level; see
``user_program.py``. A collective of ours placed between Lightning's lazy metric syncs
deadlocked the first of these at the first epoch end.
"""

import json
import math

import pytest
import torch

from tests.e2e.launch import run_script

SAMPLES = 96


def _run(tmp_path, *args: str) -> dict:
    out = tmp_path / "result.json"
    run_script("user_program.py", str(out), *args, timeout=240)
    return json.loads(out.read_text())


def _epochs(seen: list[list[list[int]]], steps_per_epoch: int) -> list[list[int]]:
    """Sample indices trained per epoch, all ranks together."""
    steps = len(seen[0])
    return [
        sorted(i for rank in seen for batch in rank[start : start + steps_per_epoch] for i in batch)
        for start in range(0, steps, steps_per_epoch)
    ]


@pytest.mark.parametrize(
    "args",
    [
        pytest.param((), id="tqdm-hetero-callback-attached"),
        pytest.param(
            ("--bar", "rich", "--hetero-callback", "first", "--adjust-every", "2"),
            id="rich-hetero-callback-first-adjust-every-2",
        ),
        pytest.param(
            ("--hetero-callback", "last", "--adjust-every", "5"),
            id="tqdm-hetero-callback-last-adjust-every-5",
        ),
    ],
)
def test_epoch_level_synced_metrics_with_the_progress_bar_do_not_deadlock(tmp_path, args):
    result = _run(tmp_path, *args)
    steps_per_epoch = SAMPLES // 16  # batch_size 8 on 2 ranks
    assert result["global_step"] == 2 * steps_per_epoch
    # the @rank_zero_only callback read the epoch-level values at both epoch ends
    assert len(result["read_on_rank0"]) == 2
    assert {"train/acc", "train/loss_epoch", "val/loss", "val/acc"} <= set(
        result["read_on_rank0"][0]
    )
    every = 5 if "5" in args else 2 if "2" in args else None
    boundaries = 2 if every is None else 2 * steps_per_epoch // every
    assert len(result["history"]) == boundaries
    assert result["checkpoint"].endswith(".ckpt")
    # every sample once per epoch, in a new order each epoch, as under DDP
    epochs = _epochs(result["seen"], steps_per_epoch)
    assert epochs == [list(range(SAMPLES))] * 2
    first_steps = [result["seen"][0][0], result["seen"][0][steps_per_epoch]]
    assert first_steps[0] != first_steps[1] and first_steps[0] != list(range(len(first_steps[0])))


def test_configure_optimizers_reading_estimated_stepping_batches_gets_the_real_plan(tmp_path):
    # OneCycleLR from Lightning's docs: the loader is loaded before our set-up runs
    result = _run(tmp_path, "--onecycle", "--cores", "--epochs", "1")
    steps = SAMPLES // 16
    assert result["global_step"] == steps
    assert result["lr_steps"] == steps  # the schedule's length matched the real loader
    assert len(result["history"]) == 1 and result["history"][0]["batch_sizes"] == [8, 8]
    assert _epochs(result["seen"], steps) == [list(range(SAMPLES))]


def test_batchnorm_model_with_a_three_sample_tail_trains_like_ddp(tmp_path):
    # 643 samples, batch_size 32 on 2 ranks: the last step has 3 samples, which a [2, 1]
    # split would hand BatchNorm a batch of one; DDP's sampler pads, so do we
    result = _run(
        tmp_path, "--bn", "--samples", "643", "--batch-size", "32", "--epochs", "1", "--in-order"
    )
    seen = result["seen"]
    assert [len(rank[-1]) for rank in seen] == [2, 2]
    assert all(len(batch) >= 2 for rank in seen for batch in rank)
    used = [i for rank in seen for batch in rank for i in batch]
    assert sorted(set(used)) == list(range(643)) and len(used) == 644
    assert seen[0][0] == list(range(32))  # shuffle=False keeps the dataset's order


def test_several_training_loaders_are_refused_at_fit_start(tmp_path):
    with pytest.raises(AssertionError, match="found 2 training DataLoaders"):
        _run(tmp_path, "--loaders", "2", "--epochs", "1")


def test_a_resume_after_in_epoch_validation_records_no_empty_boundary(tmp_path):
    # val_check_interval=0.5: the checkpoint is written by the validation after the epoch's
    # last batch, before the epoch ends; the resumed fit ends that epoch with no batch left
    options = ("--val-check-interval", "0.5", "--plan", "10,6")
    first = _run(tmp_path, "--epochs", "1", *options)
    saved = torch.load(first["checkpoint"], weights_only=False)
    assert saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["is_last_batch"]
    assert saved["callbacks"]["HeteroCallback"]["history"] == []  # before the epoch's boundary
    out = tmp_path / "resumed.json"
    proc = run_script(
        "user_program.py",
        str(out),
        "--epochs",
        "2",
        "--resume",
        first["checkpoint"],
        *options,
        timeout=240,
        warnings=True,
    )
    output = proc.stdout + proc.stderr
    assert "no finite step timings" not in output and "hetero: " not in output, output[-3000:]
    resumed = json.loads(out.read_text())
    (entry,) = resumed["history"]  # epoch 1's boundary only: none for the empty epoch 0
    assert entry["epoch"] == 1 and entry["batch_sizes"] == [10, 6]
    assert all(math.isfinite(t) and t > 0 for t in entry["compute_times"])
    steps = SAMPLES // 16
    assert resumed["global_step"] == 2 * steps
    # the saved plan goes on: epoch 1 trains every sample in batches of 10 and 6
    assert [[len(batch) for batch in rank] for rank in resumed["seen"]] == [[10] * 6, [6] * 6]
    assert _epochs(resumed["seen"], steps) == [list(range(SAMPLES))]
