import contextlib
import copy
import mmap
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from lightning_hetero import memory_probe
from lightning_hetero.memory_probe import (
    ProbeResult,
    auto_max_batch_size,
    budget_sharers,
    cuda_budget_bytes,
    host_budget_bytes,
    is_out_of_memory,
    preserved_state,
    probe_memory,
)
from lightning_hetero.planning import MemoryModel, PlanError

KIB, MIB = 2**10, 2**20
FIXED_BYTES, PER_SAMPLE_BYTES = 2 * MIB, 64 * KIB
SIZES = [16, 32, 64, 128]  # at most 10 MiB per step


def resident_buffer(nbytes):
    """An anonymous mapping of ``nbytes`` with every page written, so all of it is resident.

    Mapped directly rather than through malloc, so that its pages come and go with it
    whatever the C allocator kept from earlier tests.
    """
    buffer = mmap.mmap(-1, nbytes)
    view = np.frombuffer(buffer, np.uint8)
    view[:] = 1
    del view
    return buffer


def allocating_step(kind):
    """A step whose peak is a buffer of FIXED + PER_SAMPLE * b bytes, released on return."""

    def step(batch_size):
        nbytes = FIXED_BYTES + PER_SAMPLE_BYTES * batch_size
        if kind == "mmap":
            resident_buffer(nbytes).close()
        else:  # through torch's CPU allocator, the path real training takes
            tensor = torch.ones(nbytes, dtype=torch.uint8)
            del tensor

    return step


# ---------------------------------------------------------------- CPU measurements


@pytest.mark.parametrize("kind", ["mmap", "torch"])
def test_cpu_probe_recovers_the_per_sample_cost_within_ten_percent(kind):
    result = probe_memory(allocating_step(kind), SIZES, torch.device("cpu"))
    assert result.succeeded == SIZES and result.failed_size is None and result.skipped == ()
    model = MemoryModel.fit(result.samples)
    assert model.per_sample_bytes == pytest.approx(PER_SAMPLE_BYTES, rel=0.1)
    assert result.budget_bytes > 0


@pytest.mark.skipif(not memory_probe._reset_peak_rss(), reason="needs Linux /proc/self/clear_refs")
def test_an_earlier_higher_peak_does_not_mask_the_steps():
    # Raise the process's lifetime peak well above anything the steps reach: only a
    # peak that is reset before each step still sees them.
    resident_buffer(4 * (FIXED_BYTES + PER_SAMPLE_BYTES * SIZES[-1])).close()
    result = probe_memory(allocating_step("mmap"), SIZES, "cpu")
    model = MemoryModel.fit(result.samples)
    assert model.per_sample_bytes == pytest.approx(PER_SAMPLE_BYTES, rel=0.1)


def test_sampling_fallback_measures_memory_a_step_keeps(monkeypatch):
    # Without the kernel's resettable peak (non-Linux), RSS is sampled; memory a step
    # keeps (like gradients and optimizer state) shows in the RSS after the step.
    monkeypatch.setattr(memory_probe, "_reset_peak_rss", lambda: False)
    kept = []

    def step(batch_size):
        for buffer in kept:
            buffer.close()
        kept[:] = [resident_buffer(FIXED_BYTES + PER_SAMPLE_BYTES * batch_size)]

    result = probe_memory(step, SIZES, "cpu")
    kept[0].close()
    model = MemoryModel.fit(result.samples)
    assert model.per_sample_bytes == pytest.approx(PER_SAMPLE_BYTES, rel=0.1)


def test_sizes_run_ascending_once_each():
    calls = []
    probe_memory(calls.append, [64, 16, 32, 16], "cpu")
    assert calls == [16, 32, 64]


def test_a_host_allocation_failure_ends_the_probe_and_the_fit_uses_the_sizes_that_ran():
    calls = []

    def step(batch_size):
        calls.append(batch_size)
        if batch_size > 64:  # as torch's CPU allocator words it
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate")
        allocating_step("mmap")(batch_size)

    sizes = [16, 32, 64, 128, 256]
    result = probe_memory(step, sizes, "cpu")
    assert calls == [16, 32, 64, 128]
    assert result.succeeded == [16, 32, 64] and result.failed_size == 128
    assert result.skipped == (256,) and result.tried == [16, 32, 64, 128]
    assert "can't allocate memory" in result.failure

    bound, model, result = auto_max_batch_size(step, sizes, "cpu")
    assert model.per_sample_bytes == pytest.approx(PER_SAMPLE_BYTES, rel=0.1)
    assert bound == 127  # the fit allows far more, but 128 is known not to fit


@pytest.mark.parametrize(
    "error",
    [MemoryError("Unable to allocate 1 TiB"), RuntimeError("CUDA error: out of memory")],
)
def test_memory_errors_of_any_flavour_count_as_out_of_memory(error):
    def step(batch_size):
        if batch_size >= 32:
            raise error

    result = probe_memory(step, [8, 16, 32], "cpu")
    assert result.succeeded == [8, 16] and result.failed_size == 32
    assert result.failure.startswith(type(error).__name__)


def test_other_errors_propagate():
    def step(batch_size):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):
        probe_memory(step, [8, 16], "cpu")


def test_no_size_fitting_is_a_clear_error_naming_the_sizes():
    def step(batch_size):
        raise MemoryError("no room at all")

    with pytest.raises(PlanError, match=r"tried batch sizes \[16\], none of them ran.*no room"):
        auto_max_batch_size(step, [64, 16, 32], "cpu")


def test_a_single_size_that_ran_is_not_enough_to_fit():
    def step(batch_size):
        if batch_size > 16:
            raise MemoryError("no room")

    with pytest.raises(PlanError, match=r"tried batch sizes \[16, 32\], only \[16\] ran"):
        auto_max_batch_size(step, [16, 32, 64], "cpu")
    with pytest.raises(PlanError, match="two distinct sizes"):
        auto_max_batch_size(lambda b: None, [16], "cpu")


def test_sizes_predicted_to_exceed_the_budget_are_skipped(monkeypatch):
    monkeypatch.setattr(memory_probe, "host_budget_bytes", lambda: 8.0 * MIB)
    calls = []

    def step(batch_size):
        calls.append(batch_size)
        allocating_step("mmap")(batch_size)

    # 2 MiB + 64 KiB * b: 16 -> 3 MiB, 32 -> 4 MiB, then 128 -> 10 MiB is over 8 MiB.
    result = probe_memory(step, [16, 32, 128, 256], "cpu")
    assert calls == [16, 32]
    assert result.skipped == (128, 256) and result.failed_size is None


def test_auto_bound_uses_the_safety_fraction_of_the_budget(monkeypatch):
    monkeypatch.setattr(memory_probe, "host_budget_bytes", lambda: 100.0 * MIB)
    bound, model, result = auto_max_batch_size(allocating_step("mmap"), SIZES, "cpu", safety=0.5)
    assert result.budget_bytes == 100.0 * MIB
    assert bound == model.max_batch_size(100.0 * MIB, safety=0.5)
    # About (50 MiB - 2 MiB) / 64 KiB = 768 samples.
    assert bound == pytest.approx(768, rel=0.1)
    assert auto_max_batch_size(allocating_step("mmap"), SIZES, "cpu", cap=100)[0] == 100
    # four ranks on the host: each plans for a quarter of the budget
    shared, model, _ = auto_max_batch_size(allocating_step("mmap"), SIZES, "cpu", 0.5, share=4)
    assert shared == model.max_batch_size(25.0 * MIB, safety=0.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"safety": 0.0}, "safety"), ({"cap": 0}, "cap"), ({"share": 0}, "share")],
)
def test_bad_arguments_are_rejected_before_probing(kwargs, message):
    calls = []
    with pytest.raises(ValueError, match=message):
        auto_max_batch_size(calls.append, SIZES, "cpu", **kwargs)
    with pytest.raises(ValueError, match="sizes"):
        probe_memory(calls.append, [0, 4], "cpu")
    assert calls == []


def test_is_out_of_memory_recognises_allocator_messages():
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate"))
    assert is_out_of_memory(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: not enough memory: you tried"))
    assert not is_out_of_memory(ValueError("out of memory"))
    assert not is_out_of_memory(RuntimeError("Expected all tensors to be on the same device"))


# ---------------------------------------------------------------- budgets


def write_files(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_host_budget_is_capped_by_a_cgroup_v2_limit(tmp_path):
    write_files(
        tmp_path,
        {
            "memory.max": f"{1024 * MIB}\n",
            "memory.current": f"{700 * MIB}\n",
            "memory.stat": f"anon {500 * MIB}\ninactive_file {100 * MIB}\n",
        },
    )
    # limit - (usage - inactive page cache) = 1024 - 600 MiB
    assert host_budget_bytes(tmp_path) == 424 * MIB


def test_host_budget_is_capped_by_a_cgroup_v1_limit(tmp_path):
    write_files(
        tmp_path,
        {
            "memory/memory.limit_in_bytes": f"{512 * MIB}\n",
            "memory/memory.usage_in_bytes": f"{600 * MIB}\n",
            "memory/memory.stat": f"inactive_file 1\ntotal_inactive_file {50 * MIB}\n",
        },
    )
    assert host_budget_bytes(tmp_path) == 0.0  # over the limit already


def test_host_budget_without_a_limit_is_the_available_memory(tmp_path, monkeypatch):
    class Available:
        available = 3 * 2**30

    monkeypatch.setattr(memory_probe.psutil, "virtual_memory", lambda: Available)
    assert host_budget_bytes(tmp_path) == 3 * 2**30  # no cgroup files at all
    write_files(tmp_path, {"memory.max": "max\n"})
    assert host_budget_bytes(tmp_path) == 3 * 2**30
    write_files(tmp_path, {"memory.max": "garbage\n", "memory.current": "0\n"})
    assert host_budget_bytes(tmp_path) == 3 * 2**30  # unreadable: ignored


def test_host_budget_ignores_a_v1_limit_that_means_unlimited_or_an_unknown_usage(
    tmp_path, monkeypatch
):
    class Available:
        available = 3 * 2**30

    monkeypatch.setattr(memory_probe.psutil, "virtual_memory", lambda: Available)
    write_files(tmp_path, {"memory/memory.limit_in_bytes": f"{2**63 - 4096}\n"})
    assert host_budget_bytes(tmp_path) == 3 * 2**30  # v1's "no limit"
    write_files(tmp_path, {"memory/memory.limit_in_bytes": f"{MIB}\n"})
    assert host_budget_bytes(tmp_path) == 3 * 2**30  # no usage file: unknown
    write_files(tmp_path, {"memory/memory.usage_in_bytes": f"{MIB // 4}\n"})
    assert host_budget_bytes(tmp_path) == 0.75 * MIB  # no memory.stat: no inactive cache


def test_host_budget_v2_without_memory_stat_counts_all_usage(tmp_path):
    write_files(tmp_path, {"memory.max": f"{4 * MIB}\n", "memory.current": f"{MIB}\n"})
    assert host_budget_bytes(tmp_path) == 3 * MIB


# ---------------------------------------------------------------- CUDA logic on a fake device


class FakeCuda:
    """The slice of ``torch.cuda`` the probe uses, over a simulated caching allocator."""

    def __init__(self, capacity, other_processes=0):
        self.capacity, self.other_processes = capacity, other_processes
        self.allocated = self.reserved = self.peak = 0
        self.events = []

    def allocate(self, nbytes):
        if self.other_processes + max(self.reserved, self.allocated + nbytes) > self.capacity:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {nbytes}\nmore text"
            )
        self.allocated += nbytes
        self.reserved = max(self.reserved, self.allocated)
        self.peak = max(self.peak, self.allocated)

    def free(self, nbytes):
        self.allocated -= nbytes

    def install(self, monkeypatch):
        def empty_cache():
            self.events.append("empty_cache")
            self.reserved = self.allocated

        def reset_peak(device):
            self.events.append("reset")
            self.peak = self.allocated

        calls = {
            "mem_get_info": lambda device: (
                self.capacity - self.other_processes - self.reserved,
                self.capacity,
            ),
            "memory_allocated": lambda device: self.allocated,
            "memory_reserved": lambda device: self.reserved,
            "max_memory_allocated": lambda device: self.peak,
            "reset_peak_memory_stats": reset_peak,
            "synchronize": lambda device: None,
            "empty_cache": empty_cache,
        }
        for name, call in calls.items():
            monkeypatch.setattr(torch.cuda, name, call)


@pytest.fixture
def fake_gpu(monkeypatch):
    gpu = FakeCuda(capacity=1000 * MIB, other_processes=100 * MIB)
    gpu.allocate(50 * MIB)  # the model, already on the device
    gpu.allocate(30 * MIB)
    gpu.free(30 * MIB)  # cached by the allocator: part of the budget
    gpu.install(monkeypatch)
    return gpu


def fake_training_step(gpu, fixed, per_sample, fail_above=None):
    def step(batch_size):
        gpu.allocate(fixed)
        gpu.events.append(batch_size)
        if fail_above is not None and batch_size > fail_above:
            gpu.allocate(gpu.capacity)  # fragmentation, a lazily loaded kernel, ...
        gpu.allocate(per_sample * batch_size)  # activations, freed after backward
        gpu.free(per_sample * batch_size + fixed)

    return step


def test_cuda_probe_measures_the_allocator_peak_above_the_start(fake_gpu):
    step = fake_training_step(fake_gpu, fixed=20 * MIB, per_sample=MIB)
    result = probe_memory(step, [16, 32, 64], torch.device("cuda", 0))
    assert result.samples == ((16, 36.0 * MIB), (32, 52.0 * MIB), (64, 84.0 * MIB))
    # The cache is emptied first, then the budget is 1000 - 100 (others) - 50 (model) MiB.
    assert result.budget_bytes == 850 * MIB
    assert fake_gpu.events == ["empty_cache", "reset", 16, "reset", 32, "reset", 64]


def test_cuda_out_of_memory_empties_the_cache_and_the_fit_uses_the_sizes_that_ran(fake_gpu):
    step = fake_training_step(fake_gpu, fixed=20 * MIB, per_sample=MIB, fail_above=256)
    bound, model, result = auto_max_batch_size(
        step, [32, 64, 128, 256, 512, 1024], torch.device("cuda", 0), safety=0.9
    )
    assert result.succeeded == [32, 64, 128, 256] and result.failed_size == 512
    assert result.failure.startswith("OutOfMemoryError: CUDA out of memory")
    assert result.skipped == (1024,)
    assert fake_gpu.events[-1] == "empty_cache"
    assert model.fixed_bytes == pytest.approx(20 * MIB)
    assert model.per_sample_bytes == pytest.approx(MIB)
    # The line allows (0.9 * 850 - 20) MiB / 1 MiB = 745 samples, but 512 failed.
    assert model.max_batch_size(result.budget_bytes, safety=0.9) == 745
    assert bound == 511


def test_cuda_sizes_predicted_over_the_budget_are_not_run(fake_gpu):
    step = fake_training_step(fake_gpu, fixed=20 * MIB, per_sample=4 * MIB)
    # 20 + 4 * 256 MiB is predicted over the 850 MiB budget: skipped, not provoked.
    bound, _, result = auto_max_batch_size(step, [32, 64, 128, 256], torch.device("cuda", 0))
    assert result.succeeded == [32, 64, 128] and result.skipped == (256,)
    assert result.failed_size is None and 256 not in fake_gpu.events
    assert bound == int((0.9 * 850 - 20) // 4)


def test_cuda_budget_counts_free_memory_and_the_allocators_unused_cache(fake_gpu):
    assert cuda_budget_bytes(torch.device("cuda", 0)) == (1000 - 100 - 80) * MIB + 30 * MIB


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_probe_fits_activation_memory_and_survives_out_of_memory():
    device = torch.device("cuda", torch.cuda.current_device())
    per_sample = 256 * KIB

    def step(batch_size):
        if batch_size > 1024:
            torch.empty(2**50, dtype=torch.uint8, device=device)  # far beyond any GPU
        torch.ones(per_sample * batch_size, dtype=torch.uint8, device=device)

    allocated_before = torch.cuda.memory_allocated(device)
    bound, model, result = auto_max_batch_size(step, [64, 128, 256, 512, 2048], device)
    assert result.succeeded == [64, 128, 256, 512] and result.failed_size == 2048
    assert model.per_sample_bytes == pytest.approx(per_sample, rel=0.1)
    assert bound == 2047
    assert torch.cuda.memory_allocated(device) == allocated_before


# ---------------------------------------------------------------- probing leaves training alone


def small_model():
    return nn.Sequential(
        nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 4)
    )


def training_step(model, optimizer):
    def step(batch_size):
        model.train()
        inputs, targets = torch.randn(batch_size, 16), torch.randint(0, 4, (batch_size,))
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()

    return step


def snapshot(model, optimizer):
    return copy.deepcopy(
        {
            "tensors": [t.detach() for t in [*model.parameters(), *model.buffers()]],
            "grads": [p.grad for p in model.parameters()],
            "optimizer": optimizer.state_dict(),
        }
    )


def assert_same(left, right):
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor) and torch.equal(left, right)
    elif isinstance(left, dict):
        assert left.keys() == right.keys()
        for key in left:
            assert_same(left[key], right[key])
    elif isinstance(left, (list, tuple)):
        assert len(left) == len(right)
        for a, b in zip(left, right):
            assert_same(a, b)
    else:
        assert left == right


OPTIMIZERS = {
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


@pytest.mark.parametrize("warm_steps", [0, 2])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_probing_leaves_model_optimizer_and_training_unchanged(name, warm_steps):
    torch.manual_seed(0)
    probed = small_model()
    torch.manual_seed(0)
    untouched = small_model()
    probed_optimizer, untouched_optimizer = (
        OPTIMIZERS[name](probed.parameters()),
        OPTIMIZERS[name](untouched.parameters()),
    )
    rng = torch.get_rng_state()
    for _ in range(warm_steps):
        training_step(probed, probed_optimizer)(8)
    torch.set_rng_state(rng)
    for _ in range(warm_steps):
        training_step(untouched, untouched_optimizer)(8)
    probed.eval()
    before = snapshot(probed, probed_optimizer)
    rng = torch.get_rng_state()

    with preserved_state(probed, probed_optimizer):
        result = probe_memory(training_step(probed, probed_optimizer), [8, 32, 128], "cpu")
        changed = snapshot(probed, probed_optimizer)
    assert result.succeeded == [8, 32, 128]
    with pytest.raises(AssertionError):
        assert_same(before, changed)  # probing did train, so the restore is what is tested

    assert_same(before, snapshot(probed, probed_optimizer))
    assert not probed.training and not any(m.training for m in probed.modules())
    assert torch.equal(torch.get_rng_state(), rng)
    # The next real step is exactly the step the model would have taken without probing.
    training_step(probed, probed_optimizer)(8)
    torch.set_rng_state(rng)
    training_step(untouched, untouched_optimizer)(8)
    assert_same(snapshot(probed, probed_optimizer), snapshot(untouched, untouched_optimizer))


def test_preserved_state_restores_after_an_exception_and_other_stateful_objects():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    before = snapshot(model, optimizer)
    with pytest.raises(MemoryError), preserved_state(model, [optimizer, scheduler]):
        training_step(model, optimizer)(4)
        scheduler.step()
        raise MemoryError
    assert_same(before, snapshot(model, optimizer))
    assert scheduler.last_epoch == 0 and optimizer.param_groups[0]["lr"] == 0.1


def test_probe_result_lists_what_ran():
    result = ProbeResult(torch.device("cpu"), 1.0, ((1, 1.0), (2, 2.0)), 4, "MemoryError: x", (8,))
    assert result.succeeded == [1, 2] and result.tried == [1, 2, 4]


def test_probe_runs_after_the_optimizers_exist_when_configure_optimizers_loads_the_data():
    # The OneCycleLR pattern: `estimated_stepping_batches` makes Lightning load the training
    # data inside strategy set-up, before any optimizer exists.
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
    from torch.utils.data import DataLoader

    from lightning_hetero import HeteroStrategy

    class OneCycle(BoringModel):
        optimizers_seen: list[int] = []

        def training_step(self, batch, batch_idx):
            self.optimizers_seen.append(len(self.trainer.strategy.optimizers))
            return super().training_step(batch, batch_idx)

        def configure_optimizers(self):
            optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
            steps = self.trainer.estimated_stepping_batches
            scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.01, total_steps=steps)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
            }

        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64), batch_size=8)

        def val_dataloader(self):
            return None

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=HeteroStrategy(max_batch_size="auto"),
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        limit_val_batches=0,
    )
    model = OneCycle()
    trainer.fit(model)
    probe_steps = len(model.optimizers_seen) - 8  # 8 training steps of 8 samples
    assert probe_steps > 0 and trainer.strategy.memory_probe is not None
    assert set(model.optimizers_seen) == {1}  # the probe's steps too: optimizer state counts
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 8


def test_ranks_on_a_gpu_split_its_budget_unless_mps_gives_each_client_its_own_limit():
    gpu0, gpu1 = torch.device("cuda", 0), torch.device("cuda", 1)
    devices = [gpu0, gpu0, gpu0, gpu1]
    assert budget_sharers(gpu0, devices, environ={}) == 3
    assert budget_sharers(gpu1, devices, environ={}) == 1
    # under MPS with a per-client limit, mem_get_info reports the client's own budget
    limited = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3G"}
    assert budget_sharers(gpu0, devices, environ=limited) == 1
    # host memory is shared by every rank of the host, MPS or not
    cpu = torch.device("cpu")
    assert budget_sharers(cpu, [cpu] * 4, environ=limited) == 4


def test_the_probe_plans_an_mps_limited_client_for_its_whole_reported_budget(monkeypatch):
    # four ranks on one GPU; an MPS client limited to 3 GiB sees that limit in mem_get_info
    from lightning_hetero import _probes

    seen = {}

    def fake_auto(step, sizes, device, safety, cap, share, agree):
        seen["share"] = share
        raise RuntimeError("stop here")

    monkeypatch.setattr(_probes, "auto_max_batch_size", fake_auto)
    monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=3G")
    gpu = torch.device("cuda", 0)
    probe = _probes.StepProbe.__new__(_probes.StepProbe)
    probe.context = SimpleNamespace(device=gpu, devices=[gpu] * 4)
    probe.loader = SimpleNamespace(dataset=range(100))
    probe.agree = probe.micro = None
    monkeypatch.setattr(probe, "steps", lambda *a, **k: contextlib.nullcontext(None), raising=False)
    with pytest.raises(RuntimeError, match="stop here"):
        probe.memory(32, [4, 8], 0.9)
    assert seen["share"] == 1
    monkeypatch.delenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
    with pytest.raises(RuntimeError, match="stop here"):
        probe.memory(32, [4, 8], 0.9)
    assert seen["share"] == 4


def _probe_that_finds(monkeypatch, bound, micro=None):
    """A StepProbe whose probe finds ``bound`` on every one of two ranks; its messages kept."""
    from lightning_hetero import _probes

    model = SimpleNamespace(fixed_bytes=1.0, per_sample_bytes=2.0, relative_error=0.0)
    result = SimpleNamespace(budget_bytes=100.0, samples=[(4, 9.0)], tried=[4, 8])

    def fake_auto(step, sizes, device, safety, cap, share, agree):
        if bound < 1:
            raise _probes.PlanError("does not fit")
        return bound, model, result

    said = []
    monkeypatch.setattr(_probes, "auto_max_batch_size", fake_auto)
    monkeypatch.setattr(_probes, "rank_zero_info", said.append)
    cpu = torch.device("cpu")
    probe = _probes.StepProbe.__new__(_probes.StepProbe)
    gather = lambda row: [list(row), list(row)]  # noqa: E731
    probe.context = SimpleNamespace(
        device=cpu, devices=[cpu] * 2, comm=SimpleNamespace(gather_rows=gather)
    )
    probe.loader = SimpleNamespace(dataset=range(100))
    probe.agree = None
    probe.micro = micro
    monkeypatch.setattr(probe, "steps", lambda *a, **k: contextlib.nullcontext(None), raising=False)
    return probe, said


@pytest.mark.parametrize(
    ("max_auto", "micro_auto", "named", "what"),
    [
        (True, False, "max_batch_size='auto': per-rank maximum batch", None),
        (False, True, "micro_batch_size='auto': per-rank micro-batch", "max_batch_size"),
        (True, True, "max_batch_size='auto' and micro_batch_size='auto': per-rank micro", None),
    ],
)
def test_the_memory_probe_names_the_option_the_user_set(
    monkeypatch, max_auto, micro_auto, named, what
):
    # issue 43: micro_batch_size="auto" printed "max_batch_size='auto': per-rank maximum
    # batch sizes", an option the user had not set
    probe, said = _probe_that_finds(monkeypatch, 8)
    found = probe.memory(32, [4, 8], 0.9, max_auto=max_auto, micro_auto=micro_auto)
    assert found["max_batch_sizes"] == [8, 8]
    assert len(said) == 1 and said[0].startswith(named), said
    if what is not None:
        assert what not in said[0]


def test_the_memory_probe_refusal_names_micro_batch_size_when_the_user_set_it(monkeypatch):
    probe, _ = _probe_that_finds(monkeypatch, 0)
    with pytest.raises(PlanError, match=r"^hetero: micro_batch_size='auto': .*`micro_batch_size`"):
        probe.memory(32, [4, 8], 0.9, max_auto=False, micro_auto=True)
