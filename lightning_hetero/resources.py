"""What each rank's process can use: CPU cores and GPU compute for open-loop plans, and the
memory and host readings controllers see at each boundary."""

import math
import os
import time
from pathlib import Path

import psutil
import torch
from lightning_utilities.core.rank_zero import rank_zero_warn

import lightning_hetero._cgroup as _cgroup  # not `from lightning_hetero import`: a cycle
from lightning_hetero.collectives import Collectives

__all__ = [
    "ResourceMeter",
    "available_cores",
    "flops_or_nan",
    "gather_capacities",
    "gpu_flops",
    "reset_peak_memory",
]


def _cgroup_cpu_limit(root: Path = _cgroup.DEFAULT_ROOT) -> float | None:
    """CPU quota of this process's cgroup in cores, or ``None`` when unlimited or unknown."""
    found = _cgroup.controller_dir("cpu", root)
    if found is None:
        return None
    if found.version == 2:  # cpu.max: "<quota> <period>", quota "max" when unlimited
        quota = _cgroup.read_limit(found.path / "cpu.max")
        period = _cgroup.read_int(found.path / "cpu.max", field=1)
    else:  # quota -1 when unlimited
        quota = _cgroup.read_limit(found.path / "cpu.cfs_quota_us")
        period = _cgroup.read_int(found.path / "cpu.cfs_period_us")
    return quota / period if quota and period else None


def available_cores(cgroup_root: Path = _cgroup.DEFAULT_ROOT) -> float:
    """Cores this process may run on: its CPU affinity, capped by a cgroup CPU quota.

    Ranks that share a machine share its cores; each rank reports what its own
    process is allowed, so pin ranks (``taskset``, container CPU limits) for this
    to mean anything.
    """
    try:
        cores = float(len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        cores = float(os.cpu_count() or 1)
    try:
        limit = _cgroup_cpu_limit(cgroup_root)
    except (OSError, ValueError):
        limit = None
    return min(cores, limit) if limit else cores


def gpu_flops(device: torch.device) -> float:
    """A FLOPs proxy for a CUDA device: streaming multiprocessors x maximum SM clock (MHz).

    The SM count comes from torch, the clock from NVML (nvidia-ml-py); the device is
    matched by UUID so ``CUDA_VISIBLE_DEVICES`` renumbering does not matter.
    """
    try:
        import pynvml
    except ImportError as error:
        raise ImportError(
            "batch_sizes='flops' on a GPU reads each GPU's SM clock through NVML, from the"
            " nvidia-ml-py package, which is not installed: pip install"
            " 'lightning_hetero[gpu]' (or choose batch_sizes='uniform' or 'probe')."
        ) from error

    props = torch.cuda.get_device_properties(device)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{props.uuid}")
        clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
    finally:
        pynvml.nvmlShutdown()
    return float(props.multi_processor_count * clock_mhz)


def reset_peak_memory(device: torch.device) -> None:
    """Reset the peak-memory counter that ``ResourceMeter`` and the memory probe read.

    On a CUDA device: the caching allocator's peak statistics
    (``torch.cuda.reset_peak_memory_stats``), so that the next
    ``max_memory_reserved``/``max_memory_allocated`` count from now. On any other device
    nothing: ``ResourceMeter`` reads no peak there (it reads the host's memory in use
    now), and the memory probe's host path resets the kernel's peak-RSS mark itself
    before each step it measures.
    """
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def flops_or_nan(device: torch.device) -> float:
    """``gpu_flops`` of ``device``, or NaN where it is not a CUDA device or NVML fails.

    The caller falls back to cores for *all* ranks when any rank has no FLOPs figure:
    mixing FLOPs and cores in one split would be meaningless.
    """
    return _flops_reading(device)[0]


def _flops_reading(device: torch.device) -> tuple[float, str]:
    """``flops_or_nan`` and why it is NaN (``""`` where it is not)."""
    if device.type != "cuda":
        return float("nan"), f"{device} is not a CUDA device"
    try:
        return gpu_flops(device), ""
    except Exception as err:  # NVML missing, no permission, old driver
        return float("nan"), f"could not read the GPU through NVML: {err}"


def gather_capacities(kind: str, device: torch.device, comm: Collectives) -> list[float]:
    """Every rank's capacity for the initial plan ``batch_sizes=kind``, in rank order.

    ``"cores"``: the CPU cores each rank's process may use; ``"flops"``: each rank's GPU SMs
    times clock, or the cores (with one warning, from rank 0, with its own reason) when some
    rank has no such reading.
    """
    flops, why = _flops_reading(device) if kind == "flops" else (0.0, "")
    rows = comm.gather_rows([available_cores(), flops])
    if kind == "flops":
        flops_per_rank = [row[1] for row in rows]
        if all(math.isfinite(f) and f > 0 for f in flops_per_rank):
            return flops_per_rank
        reason = f" (rank 0: {why})" if why else ""
        rank_zero_warn(
            "batch_sizes='flops' needs every rank on a CUDA device readable through NVML;"
            f" got {flops_per_rank}{reason}. Using CPU cores instead."
        )
    return [row[0] for row in rows]


class ResourceMeter:
    """One rank's side readings at a boundary ([`RankStats`][lightning_hetero.planning.RankStats]).

    ``read`` returns ``(memory_used, cpu_available, memory_available)``:

    * ``memory_used``: on CUDA, the device's memory in use at this process's peak since the
      previous reading (other processes' use now, plus this process's peak reserved
      memory), over the device total; on CPU, the host's memory in use over its total.
    * ``cpu_available``: the idle fraction of the host's CPUs since the previous reading.
    * ``memory_available``: the host's available memory over its total.

    Args:
        device: the rank's device.
        min_interval_s: a ``read`` sooner than this after the last one returns that one's
            readings (reading the host costs about 0.1 ms: a boundary every step or two
            would pay it at each).
    """

    def __init__(self, device: torch.device, min_interval_s: float = 0.0) -> None:
        self.device = device
        self.min_interval_s = min_interval_s
        self._cuda = device.type == "cuda"
        self._last: tuple[float, tuple[float, float, float]] | None = None  # when, what
        psutil.cpu_percent(interval=None)  # the first call only starts the interval

    def read(self) -> tuple[float, float, float]:
        """The readings since the previous call (or that call's, within ``min_interval_s``);
        resets the CUDA peak statistics."""
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < self.min_interval_s:
            return self._last[1]
        readings = self._read()
        self._last = (now, readings)
        return readings

    def _read(self) -> tuple[float, float, float]:
        cpu_available = 1.0 - psutil.cpu_percent(interval=None) / 100.0
        host = psutil.virtual_memory()
        memory_available = host.available / host.total
        if self._cuda:
            free, total = torch.cuda.mem_get_info(self.device)
            reserved = torch.cuda.memory_reserved(self.device)
            peak = torch.cuda.max_memory_reserved(self.device)
            reset_peak_memory(self.device)
            memory_used = min(1.0, (total - free - reserved + peak) / total)
        else:
            memory_used = 1.0 - memory_available
        return memory_used, cpu_available, memory_available
