"""The MPS benchmark's pieces that need no GPU: run options, report, usage errors."""

import os

import pytest
import torch

from lightning_hetero.bench import mps
from lightning_hetero.bench.run import RunConfig, _shared_gpu
from lightning_hetero.bench.workload import DigitsCNN


def _run(epoch_s, acc, plan=None, history=None):
    summary = {"epoch_s": epoch_s, "metrics": {"val_acc": acc}}
    if plan is not None:
        summary.update(batch_sizes=plan, history=history or [{"batch_sizes": [64, 64]}])
    return summary


def test_report_gives_min_median_max_of_steady_epochs_and_speedup_within_each_repeat():
    pairs = [
        {
            "ddp": _run([9.0, 2.0, 2.0, 2.0], 0.9),
            "hetero": _run([9.0, 1.0, 1.0, 1.0], 0.8, [96, 32]),
        },
        {
            "ddp": _run([9.0, 4.0, 4.0, 4.0], 0.7),
            "hetero": _run([9.0, 1.0, 1.0, 1.0], 0.6, [90, 38]),
        },
        {
            "ddp": _run([9.0, 3.0, 3.0, 3.0], 0.8),
            "hetero": _run([9.0, 2.0, 2.0, 2.0], 0.7, [94, 34]),
        },
    ]
    text = mps.report(
        [75, 25], pairs, [{"sms": 99, "flops": 1.0}, {"sms": 33, "flops": 0.3}], skip=1
    )
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "2 / 3 / 4 |" in rows["steady epoch s"]  # DDP: the first epoch is skipped
    assert "1 / 1 / 2 |" in rows["steady epoch s"]
    assert rows["speedup vs DDP"].endswith("| 1.5 / 2 / 4 |")  # 3/2, 2/1, 4/1
    assert "0.7 / 0.8 / 0.9" in rows["final val acc"]
    assert "ideal speedup from the shares 2.00" in text  # (75 + 25) / (2 * 25)
    assert "[[96, 32], [90, 38], [94, 34]]" in text
    assert "75%: 99 SMs" in text and "25%: 33 SMs" in text


def test_runs_on_a_shared_gpu_get_every_rank_on_cuda_0_over_gloo(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "2")
    # set first, so that monkeypatch restores (removes) what _shared_gpu writes
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")
    options = _shared_gpu(RunConfig(accelerator="gpu", workers=3, mps_shares=[60, 30, 10]))
    assert options == {
        "parallel_devices": [torch.device("cuda", 0)] * 3,
        "process_group_backend": "gloo",
    }
    assert os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "10"  # this rank's share
    assert _shared_gpu(RunConfig()) == {}


@pytest.mark.parametrize(
    "config, message",
    [
        (RunConfig(accelerator="tpu"), "must be 'cpu' or 'gpu'"),
        (RunConfig(mps_shares=[50, 50, 50, 50]), "needs accelerator='gpu'"),
        (RunConfig(accelerator="gpu", workers=2, mps_shares=[50]), "one percentage"),
        (RunConfig(accelerator="gpu", workers=2, mps_shares=[50, 0]), r"\[1, 100\]"),
    ],
)
def test_bad_gpu_options_are_refused(config, message):
    with pytest.raises(ValueError, match=message):
        _shared_gpu(config)


def test_the_cnn_widens_with_width_and_refuses_zero():
    narrow, wide = DigitsCNN(), DigitsCNN(width=4)
    assert wide(torch.rand(2, 1, 16, 16)).shape == (2, 10)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(wide) > 8 * count(narrow)
    with pytest.raises(ValueError, match="width"):
        DigitsCNN(width=0)


@pytest.mark.parametrize(
    "argv", [["--shares", "100"], ["--shares", "100", "0"], ["--repeats", "0"], ["--epochs", "2"]]
)
def test_usage_errors_stop_before_any_run(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        mps.main(argv)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_without_a_gpu_it_says_so_instead_of_failing_in_a_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        mps.main(["--repeats", "1"])


def test_a_daemon_that_does_not_start_leaves_the_environment_as_it_was(monkeypatch, tmp_path):
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text("#!/bin/sh\necho 'permission denied' >&2\nexit 1\n")
    control.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path), prepend=os.pathsep)
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    with pytest.raises(RuntimeError, match="permission denied"), mps.mps_daemon():
        pass
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
