import math

import pytest
import torch

from lightning_hetero import resources


def test_cgroup_v2_quota_caps_the_affinity(tmp_path, monkeypatch):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    monkeypatch.setattr(resources.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert resources.available_cores(tmp_path) == 1.5


def test_cgroup_v2_without_quota_leaves_the_affinity(tmp_path, monkeypatch):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    monkeypatch.setattr(resources.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert resources.available_cores(tmp_path) == 3.0


def test_cgroup_v1_quota_is_read(tmp_path, monkeypatch):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    monkeypatch.setattr(resources.os, "sched_getaffinity", lambda pid: {0, 1})
    assert resources.available_cores(tmp_path) == 0.5


def test_no_cgroup_means_affinity_only(tmp_path, monkeypatch):
    monkeypatch.setattr(resources.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert resources.available_cores(tmp_path / "missing") == 5.0


def test_cgroup_v1_without_quota_or_with_missing_files_leaves_the_affinity(tmp_path, monkeypatch):
    monkeypatch.setattr(resources.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    assert resources.available_cores(tmp_path) == 3.0  # no period file
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert resources.available_cores(tmp_path) == 0.5
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert resources.available_cores(tmp_path) == 3.0


def test_cgroup_v2_quota_without_a_period_or_garbage_leaves_the_affinity(tmp_path, monkeypatch):
    monkeypatch.setattr(resources.os, "sched_getaffinity", lambda pid: {0, 1})
    (tmp_path / "cpu.max").write_text("50000\n")
    assert resources.available_cores(tmp_path) == 2.0
    (tmp_path / "cpu.max").write_text("garbage 100000\n")
    assert resources.available_cores(tmp_path) == 2.0


def test_flops_are_nan_off_cuda_so_every_rank_falls_back_to_cores():
    assert math.isnan(resources.flops_or_nan(torch.device("cpu")))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.gpu
def test_flops_of_a_real_gpu_are_sm_count_times_clock():
    flops = resources.gpu_flops(torch.device("cuda", 0))
    assert flops > torch.cuda.get_device_properties(0).multi_processor_count * 100


def test_resource_meter_reads_fractions_on_cpu():
    meter = resources.ResourceMeter(torch.device("cpu"))
    sum(i * i for i in range(200_000))  # some CPU time between readings
    used, cpu_available, memory_available = meter.read()
    assert 0.0 <= cpu_available <= 1.0
    assert 0.0 < memory_available < 1.0
    assert used == pytest.approx(1.0 - memory_available)


def test_a_meter_reads_the_host_at_most_once_per_interval(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(resources.time, "monotonic", lambda: clock[0])
    meter = resources.ResourceMeter(torch.device("cpu"), min_interval_s=1.0)
    reads = []
    real = resources.psutil.virtual_memory
    monkeypatch.setattr(resources.psutil, "virtual_memory", lambda: reads.append(1) or real())
    first = meter.read()
    clock[0] += 0.5
    assert meter.read() == first and len(reads) == 1  # within the interval: the same
    clock[0] += 0.6
    meter.read()
    assert len(reads) == 2
    every = resources.ResourceMeter(torch.device("cpu"))  # the default: every call reads
    every.read(), every.read()
    assert len(reads) == 4


def test_reset_peak_memory_resets_the_cuda_peak_and_nothing_on_cpu(monkeypatch):
    resets = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", resets.append)
    resources.reset_peak_memory(torch.device("cpu"))
    assert resets == []
    resources.reset_peak_memory(torch.device("cuda", 1))
    assert resets == [torch.device("cuda", 1)]


def test_resource_meter_reads_the_cuda_peak_then_resets_it(monkeypatch):
    events = []
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (6 * gib, 10 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 1 * gib)
    monkeypatch.setattr(
        torch.cuda, "max_memory_reserved", lambda device: events.append("peak") or 3 * gib
    )
    monkeypatch.setattr(resources, "reset_peak_memory", lambda device: events.append(device))
    meter = resources.ResourceMeter(torch.device("cuda", 0))
    used, _, _ = meter.read()
    assert used == pytest.approx((10 - 6 - 1 + 3) / 10)  # others' use now plus this peak
    assert events == ["peak", torch.device("cuda", 0)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.gpu
def test_resource_meter_sees_the_cuda_peak_since_the_last_reading():
    device = torch.device("cuda", 0)
    meter = resources.ResourceMeter(device)
    meter.read()
    total = torch.cuda.mem_get_info(device)[1]
    block = torch.empty(total // 10, dtype=torch.uint8, device=device)
    del block
    torch.cuda.empty_cache()  # back to the driver (else still reserved, so still in use)
    used, _, _ = meter.read()  # the peak since the last reading holds the block
    after, _, _ = meter.read()  # the peak was reset by the previous reading
    assert used - after > 0.08


def test_an_nvml_failure_is_one_warning_per_job_with_rank_0s_reason(monkeypatch, recwarn):
    """``batch_sizes="flops"`` where NVML fails: no warning on every rank, one from rank 0
    that says why and that cores are used."""

    def fail(device):
        raise RuntimeError("NVML Shared Library Not Found")

    class Comm:
        def gather_rows(self, local):
            return [local, [4.0, float("nan")]]

    monkeypatch.setattr(resources, "gpu_flops", fail)
    monkeypatch.setattr(resources, "available_cores", lambda: 2.0)
    got = resources.gather_capacities("flops", torch.device("cuda", 0), Comm())
    assert got == [2.0, 4.0]
    messages = [str(w.message) for w in recwarn.list]
    assert len(messages) == 1
    assert (
        "rank 0: could not read the GPU through NVML: NVML Shared Library Not Found" in messages[0]
    )
    assert "Using CPU cores instead" in messages[0]
