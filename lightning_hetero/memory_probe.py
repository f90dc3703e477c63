"""Measure the peak memory of a training step at a few batch sizes and bound the batch by it.

``probe_memory`` runs a caller-given ``step(batch_size)`` at ascending sizes and
records how much memory each took at its peak; ``auto_max_batch_size`` fits
[`MemoryModel`][lightning_hetero.planning.memory.MemoryModel] to those numbers and returns
the largest batch predicted to fit (paper 003, Eq. 9 and the procedure after it).

What "memory" means here, per device:

* CUDA: the peak of ``torch.cuda.max_memory_allocated`` during the step, minus what
  was allocated when probing began. The budget is what the process can still
  allocate when probing begins: the device's free memory (``torch.cuda.mem_get_info``,
  which already counts other processes) plus the blocks the caching allocator holds
  without using them.
* CPU: the peak resident set size (RSS) of the process during the step, minus its RSS
  when probing began. On Linux the kernel's high-water mark (``VmHWM``) is reset
  before each step through ``/proc/self/clear_refs``, so the peak is exact; elsewhere
  a thread samples RSS every millisecond (short spikes can slip between samples; a
  new lifetime maximum of ``ru_maxrss`` is used when the step sets one). RSS also
  holds what the C allocator caches: with glibc, free heap memory is handed back to
  the kernel (``malloc_trim``) before each step, so that a step does not run unseen
  in memory an earlier one freed. Some caching survives that (e.g. in malloc's
  secondary arenas), so CPU fits are rougher than CUDA ones. The budget
  is the host's available memory (``psutil.virtual_memory().available``), capped by
  the headroom of the process's memory cgroup when it has a limit (a container):
  the memory the process can still gain without swapping or being killed. Ranks that
  share a host share this budget; divide it among them (``budget_sharers``).

Probing must not change training. Wrap it in ``preserved_state``, which puts the
parameters, buffers, gradients, optimizer state and random number generators back.
Run the step on the bare module, not on a ``DistributedDataParallel`` wrapper: ranks
stop probing at different sizes, and a collective in the step would then hang.
"""

import copy
import ctypes
import ctypes.util
import gc
import os
import random
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import psutil
import torch

import lightning_hetero._cgroup as _cgroup  # not `from lightning_hetero import`: a cycle
from lightning_hetero.planning.memory import MemoryModel
from lightning_hetero.planning.split import PlanError
from lightning_hetero.resources import reset_peak_memory

__all__ = [
    "ProbeResult",
    "auto_max_batch_size",
    "budget_sharers",
    "cuda_budget_bytes",
    "host_budget_bytes",
    "is_out_of_memory",
    "preserved_state",
    "probe_memory",
]

# Messages of allocation failures that arrive as a plain RuntimeError: torch's CPU
# allocator ("DefaultCPUAllocator: can't allocate memory"), older CUDA builds, cuBLAS.
_OUT_OF_MEMORY_MARKERS = (
    "out of memory",
    "can't allocate memory",
    "not enough memory",
    "cublas_status_alloc_failed",
)


@dataclass(frozen=True)
class ProbeResult:
    """What ``probe_memory`` measured on one device.

    Args:
        device: the device the steps ran on.
        budget_bytes: the memory the process could still gain when probing began (see
            the module docstring for its meaning on CUDA and on CPU).
        samples: ``(batch_size, peak_bytes)`` for each size that ran, ascending; each
            peak is counted from the memory in use when probing began.
        failed_size: the first size that ran out of memory, or ``None``.
        failure: that error's type and first line, or ``""``.
        skipped: sizes not run, after a failure or because the sizes that ran already
            predicted more memory than the budget.
    """

    device: torch.device
    budget_bytes: float
    samples: tuple[tuple[int, float], ...]
    failed_size: int | None = None
    failure: str = ""
    skipped: tuple[int, ...] = ()

    @property
    def succeeded(self) -> list[int]:
        """Batch sizes whose step completed, ascending."""
        return [size for size, _ in self.samples]

    @property
    def tried(self) -> list[int]:
        """Batch sizes whose step was started, ascending (successes and the failure)."""
        return self.succeeded + ([] if self.failed_size is None else [self.failed_size])


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says an allocation failed (on a GPU or on the host).

    Example:
        >>> is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory."))
        True
        >>> is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
        True
        >>> is_out_of_memory(RuntimeError("shape mismatch"))
        False
    """
    if isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    if isinstance(error, RuntimeError):
        message = str(error).lower()
        return any(marker in message for marker in _OUT_OF_MEMORY_MARKERS)
    return False


def cuda_budget_bytes(device: torch.device) -> float:
    """Bytes this process can still allocate on a CUDA device.

    The device's free memory plus the memory torch's caching allocator has reserved
    but not handed out (it reuses those blocks before asking the driver for more).
    """
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return float(free + cached)


#: The environment variable that gives each MPS client its own device-memory limit.
MPS_MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


def budget_sharers(
    device: torch.device,
    devices: Sequence[torch.device],
    environ: Mapping[str, str] | None = None,
) -> int:
    """How many ranks split the budget this rank measured: ranks on its GPU, or on its host.

    ``devices``: this host's ranks' devices. Under MPS with a per-client memory limit
    (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` set for this process), ``torch.cuda.mem_get_info``
    already reports this client's own limit: the device partitions the memory, and dividing
    it again by the ranks on the GPU would bound this rank to a fraction of what it holds.
    """
    environ = os.environ if environ is None else environ
    if device.type == "cuda":
        return 1 if environ.get(MPS_MEMORY_LIMIT) else sum(d == device for d in devices)
    return len(devices)


def host_budget_bytes(cgroup_root: Path = _cgroup.DEFAULT_ROOT) -> float:
    """Bytes this process can still gain in host memory without swapping or being killed.

    The host's available memory, capped by the headroom of the process's memory
    cgroup (its limit minus its working set, i.e. usage without inactive page cache)
    when that cgroup has a limit.
    """
    available = float(psutil.virtual_memory().available)
    try:
        headroom = _cgroup_memory_headroom(cgroup_root)
    except (OSError, ValueError):
        headroom = None
    return available if headroom is None else min(available, headroom)


def probe_memory(
    step: Callable[[int], object],
    sizes: Sequence[int],
    device: torch.device | str,
    agree: Callable[[bool], bool] | None = None,
) -> ProbeResult:
    """Run ``step(b)`` for each batch size, ascending, and record each step's peak memory.

    ``step`` does the work of one training step at batch size ``b`` on ``device``:
    typically a real batch of ``b`` samples through forward, backward and the optimizer
    step. It must keep no references to its tensors once it returns. Wrap probing in
    ``preserved_state`` so that it leaves the model and optimizer as they were.

    Each peak is counted from the memory in use when probing began, so what the first
    step creates and keeps (gradients, optimizer moments) is part of every measurement,
    as it is part of training. Sizes run in ascending order, so the first one that runs
    out of memory (``is_out_of_memory``) ends probing: the error is recorded, the
    memory freed (and the CUDA cache emptied), and the larger sizes skipped. Once two
    sizes have run, a size whose predicted memory exceeds the budget is skipped too, so
    the probe does not provoke the failure (on Linux an exhausted host tends to end the
    process rather than raise). Any other error propagates.

    Args:
        step: runs one step at the given batch size.
        sizes: batch sizes to try, each at least 1 (order and repeats do not matter).
        device: where ``step`` allocates: a CUDA device, or the CPU (host memory).
        agree: where steps communicate across ranks (sharded models), every rank must run
            the same sizes: ``agree(skip)`` returns whether any rank skips the next size.

    Example:
        >>> def step(batch_size):
        ...     torch.ones(1_000_000 + 100_000 * batch_size, dtype=torch.uint8)
        >>> result = probe_memory(step, [8, 16, 32], "cpu")
        >>> result.succeeded, result.failed_size
        ([8, 16, 32], None)
    """
    device = torch.device(device)
    ordered = sorted({int(size) for size in sizes})
    if not ordered or ordered[0] < 1:
        raise ValueError(f"`sizes` must be non-empty batch sizes >= 1, got {list(sizes)}.")
    meter = _CudaPeak(device) if device.type == "cuda" else _HostPeak()
    meter.start()
    budget_bytes = meter.budget()
    samples: list[tuple[int, float]] = []
    for index, size in enumerate(ordered):
        skip = len(samples) >= 2 and MemoryModel.fit(samples).predict(size) > budget_bytes
        if agree is not None:
            skip = agree(skip)
        if skip:
            return ProbeResult(device, budget_bytes, tuple(samples), skipped=tuple(ordered[index:]))
        failure = ""
        try:
            peak_bytes = meter.measure(step, size)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            first_line = (str(error).strip().splitlines() or [""])[0]
            failure = f"{type(error).__name__}: {first_line}"
        if failure:
            # Outside the except block the traceback, and the step's tensors it holds, are gone.
            meter.release()
            return ProbeResult(
                device, budget_bytes, tuple(samples), size, failure, tuple(ordered[index + 1 :])
            )
        samples.append((size, peak_bytes))
    return ProbeResult(device, budget_bytes, tuple(samples))


def auto_max_batch_size(
    step: Callable[[int], object],
    sizes: Sequence[int],
    device: torch.device | str,
    safety: float = 0.9,
    cap: int | None = None,
    share: int = 1,
    agree: Callable[[bool], bool] | None = None,
) -> tuple[int | None, MemoryModel, ProbeResult]:
    """Probe, fit the memory model and return the largest batch size predicted to fit.

    The bound is ``MemoryModel.max_batch_size(budget, safety, cap)`` on the probe's
    measurements, and stays below a size that ran out of memory during the probe.

    Args:
        step: runs one training step at the given batch size (see ``probe_memory``).
        sizes: batch sizes to probe, e.g. ``probe_sizes(global_batch)``.
        device: the device ``step`` runs on.
        safety: fraction of the budget to plan for, in ``(0, 1]``.
        cap: an upper limit from elsewhere; also the answer when memory does not grow
            with the batch (``None`` then means "no bound").
        share: how many processes split the budget (ranks on one host for host memory,
            ranks on one GPU); each plans for ``budget / share``.
        agree: see ``probe_memory``.

    Returns:
        ``(max_batch_size, model, result)``: the bound (or ``cap``, see above), the fitted
        model and the raw measurements.

    Raises:
        ValueError: ``safety`` outside ``(0, 1]`` or ``cap`` below 1 (checked before probing).
        PlanError: fewer than two sizes ran, or not even a batch of one is predicted to
            fit; the message names the sizes tried and the budget.

    Example:
        >>> def step(batch_size):
        ...     torch.ones(1_000_000 + 100_000 * batch_size, dtype=torch.uint8)
        >>> bound, model, _ = auto_max_batch_size(step, [8, 16, 32], "cpu", cap=4096)
        >>> bound
        4096
    """
    if not 0.0 < safety <= 1.0:
        raise ValueError(f"`safety` must be in (0, 1], got {safety}.")
    if cap is not None and cap < 1:
        raise ValueError(f"`cap` must be >= 1 or None, got {cap}.")
    if share < 1:
        raise ValueError(f"`share` must be >= 1, got {share}.")
    result = probe_memory(step, sizes, device, agree)
    if len(result.samples) < 2:
        ran = f"only {result.succeeded} ran" if result.samples else "none of them ran"
        why = (
            f"; size {result.failed_size} failed with {result.failure!r}"
            if result.failed_size is not None
            else " (a fit needs two distinct sizes)"
        )
        raise PlanError(
            f"Memory probe on {result.device}: tried batch sizes {result.tried}, {ran}{why}."
            f" The budget was {result.budget_bytes / 2**20:.1f} MiB. Probe smaller sizes, or"
            " set the maximum batch size explicitly."
        )
    model = MemoryModel.fit(result.samples)
    try:
        bound = model.max_batch_size(result.budget_bytes / share, safety, cap)
    except PlanError as error:
        raise PlanError(f"Memory probe on {result.device}, sizes {result.tried}: {error}") from None
    if result.failed_size is not None:
        known_limit = result.failed_size - 1
        bound = known_limit if bound is None else min(bound, known_limit)
    return bound, model, result


@contextmanager
def preserved_state(module: torch.nn.Module, optimizers: Iterable[Any] = ()) -> Iterator[None]:
    """Put a module, its optimizers and the random generators back as they were on exit.

    Saved on entry, as copies in host memory (so they cost no device memory while a
    probe runs): every parameter and buffer (including non-persistent ones), each
    parameter's gradient (or its absence), each submodule's train/eval mode, each
    optimizer's ``state_dict()`` and the torch (CPU and initialised CUDA) and Python
    ``random`` generator states. Restored on exit, also after an exception.

    Args:
        module: the model the probe trains.
        optimizers: its optimizers, or anything else with ``state_dict()`` and
            ``load_state_dict()`` that the probe changes (LR schedulers, a ``GradScaler``).

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> before = model.weight.clone()
        >>> with preserved_state(model):
        ...     _ = model.weight.data.add_(1.0)
        >>> torch.equal(model.weight, before)
        True
    """
    stateful = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
    tensors = list({id(t): t for t in [*module.parameters(), *module.buffers()]}.values())
    saved_tensors = [t.detach().to("cpu", copy=True) for t in tensors]
    parameters = list(module.parameters())
    saved_grads = [
        None if p.grad is None else p.grad.detach().to("cpu", copy=True) for p in parameters
    ]
    saved_modes = [m.training for m in module.modules()]
    saved_states = [_host_copy(obj.state_dict()) for obj in stateful]
    torch_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    python_rng = random.getstate()
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, saved in zip(tensors, saved_tensors):
                tensor.copy_(saved)
            for parameter, saved in zip(parameters, saved_grads):
                if saved is None:
                    parameter.grad = None
                elif parameter.grad is None:
                    parameter.grad = saved.to(parameter.device)
                else:
                    parameter.grad.copy_(saved)
        for submodule, training in zip(module.modules(), saved_modes):
            submodule.training = training
        for obj, state in zip(stateful, saved_states):
            obj.load_state_dict(state)
        torch.set_rng_state(torch_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        random.setstate(python_rng)


def _host_copy(value: Any) -> Any:
    """A deep copy of a state dict with every tensor copied to host memory."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _host_copy(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_host_copy(item) for item in value)
    return copy.deepcopy(value)


class _CudaPeak:
    """Peak allocated device memory per step, from the caching allocator's statistics."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.baseline_bytes = 0

    def start(self) -> None:
        self.release()
        self.baseline_bytes = torch.cuda.memory_allocated(self.device)

    def budget(self) -> float:
        return cuda_budget_bytes(self.device)

    def measure(self, step: Callable[[int], object], size: int) -> float:
        reset_peak_memory(self.device)
        step(size)
        torch.cuda.synchronize(self.device)
        return float(torch.cuda.max_memory_allocated(self.device) - self.baseline_bytes)

    def release(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()


class _HostPeak:
    """Peak resident set size per step: the kernel's resettable high-water mark, or sampling."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.baseline_bytes = 0
        self.kernel_peak = _reset_peak_rss()

    def start(self) -> None:
        self.release()
        self.baseline_bytes = self.process.memory_info().rss

    def budget(self) -> float:
        return host_budget_bytes()

    def measure(self, step: Callable[[int], object], size: int) -> float:
        _trim_heap()
        if self.kernel_peak and _reset_peak_rss():
            step(size)
            return float(_peak_rss() - self.baseline_bytes)
        lifetime_before = _lifetime_peak_rss()
        with _RssSampler(self.process) as sampler:
            step(size)
        peak = max(sampler.peak_bytes, self.process.memory_info().rss)
        lifetime_after = _lifetime_peak_rss()
        if lifetime_after > lifetime_before:  # the step set a new lifetime record: exact
            peak = max(peak, lifetime_after)
        return float(peak - self.baseline_bytes)

    def release(self) -> None:
        gc.collect()
        _trim_heap()


class _RssSampler:
    """Samples the process's RSS from a background thread while a block runs."""

    def __init__(self, process: psutil.Process, interval_s: float = 0.001) -> None:
        self.process = process
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "_RssSampler":
        self.peak_bytes = self.process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_bytes = max(self.peak_bytes, self.process.memory_info().rss)


def _trim_heap() -> None:
    """Hand the C heap's free memory back to the kernel (glibc ``malloc_trim``), if there is one.

    Without this, memory a previous step freed stays resident in malloc's free lists,
    the next step reuses it without raising RSS, and the measured peak depends on
    what ran before rather than on the batch size.
    """
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@cache
def _glibc() -> Any:
    """glibc through ctypes, or ``None`` on other C libraries and platforms."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 - raises AttributeError where malloc is not glibc's
    except (OSError, AttributeError):
        return None
    return libc


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process to its current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return _peak_rss() > 0
    except (OSError, ValueError):
        return False


def _peak_rss() -> int:
    """The kernel's peak-RSS mark of this process (``VmHWM``) in bytes, 0 when absent."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _lifetime_peak_rss() -> int:
    """The process's largest RSS so far in bytes (``ru_maxrss``), 0 where unsupported."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def _cgroup_memory_headroom(root: Path) -> float | None:
    """Memory the process's cgroup may still gain, or ``None`` when it has no limit or the
    usage is unknown."""
    found = _cgroup.controller_dir("memory", root)
    if found is None:
        return None
    if found.version == 2:
        names = ("memory.max", "memory.current", "inactive_file")
    else:
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    limit_file, usage_file, inactive_key = names
    limit = _cgroup.read_limit(found.path / limit_file)
    if limit is None:
        return None
    usage = _cgroup.read_int(found.path / usage_file)
    if usage is None:
        return None
    inactive = _cgroup.read_stat(found.path / "memory.stat", inactive_key) or 0
    return max(0.0, float(limit - (usage - inactive)))
