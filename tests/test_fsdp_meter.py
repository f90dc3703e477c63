"""CollectiveWaitMeter on stand-ins for FSDP2's parameter groups (no process group needed)."""

import time
import warnings

import pytest
import torch
from torch import nn

from lightning_hetero._fsdp import CollectiveWaitMeter, FSDPWaitMeterWarning, _fsdp_states


class _Group:
    """An FSDP2 parameter group as the meter sees it: the methods that wait for other ranks."""

    device = torch.device("cpu")

    def unshard(self, async_op=False):
        time.sleep(0.02)

    def wait_for_unshard(self):
        time.sleep(0.01)

    def post_backward(self):
        raise ValueError("FSDP's own error")

    def finalize_backward(self):
        pass


class _Sharded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.group = _Group()

    def _get_fsdp_state(self):
        return type("State", (), {"_fsdp_param_groups": [self.group]})()


def test_time_blocked_in_the_groups_waits_is_measured_and_taken_once():
    module = _Sharded()
    meter = CollectiveWaitMeter(clock="host").install(module)
    module.group.unshard()
    module.group.wait_for_unshard()
    with pytest.raises(ValueError, match="FSDP's own error"):  # FSDP's errors pass through
        module.group.post_backward()
    waited = meter.take()
    assert 0.03 <= waited < 0.5
    assert meter.take() == 0.0  # taken: the next step starts from nothing
    meter.remove()
    assert "unshard" not in vars(module.group)  # FSDP's own methods are back


def test_each_site_holds_its_own_time_and_the_total_counts_nested_calls_once():
    clock = iter([0.0, 1.0, 3.0, 4.0])  # unshard 0 - 4, a work waited on inside it 1 - 3
    module = _Sharded()
    meter = CollectiveWaitMeter(clock="host", collectives=False).install(module)
    meter._thread = None  # (the fake clock is read by the meter only)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "perf_counter", lambda: next(clock))
        inner = lambda: meter._timed("wait:all_gather_single", lambda: None, (), {})  # noqa: E731
        meter._timed("unshard", inner, (), {})
    stats = meter.take_stats()
    meter.remove()
    assert stats.by_site == {"wait:all_gather_single": 2.0, "unshard": 2.0}
    assert stats.wait_s == 4.0 and stats.calls == 1


def test_the_per_site_dump_is_read_from_the_environment_and_names_rank_and_batch():
    from lightning_hetero._fsdp import WaitStats
    from lightning_hetero.modes.sharded import WAITS_ENV, format_waits, wait_report_every

    assert wait_report_every({}) == 0 and wait_report_every({WAITS_ENV: "5"}) == 5
    with pytest.raises(ValueError, match=f"{WAITS_ENV}='yes'.*whole number"):
        wait_report_every({WAITS_ENV: "yes"})
    line = format_waits(1, 7, WaitStats(0.5, {"unshard": 0.1, "wait:broadcast": 0.4}, 3))
    assert line == (
        "hetero FSDP waits, rank 1, batch 7: 0.5000 s (wait:broadcast 0.4000, unshard 0.1000)"
    )


def test_a_module_without_fsdp_state_warns_and_measures_no_wait():
    with pytest.warns(FSDPWaitMeterWarning):
        meter = CollectiveWaitMeter(clock="host").install(nn.Linear(2, 2))
    assert meter.take() == 0.0


def test_the_meters_warning_is_rank_0s_and_the_other_ranks_log_it(monkeypatch, caplog):
    """One message per job: the same warning on every rank would print once per rank."""
    from lightning_utilities.core.rank_zero import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", 1, raising=False)
    with caplog.at_level("INFO", logger="lightning_hetero._fsdp"), warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning on rank 1 would raise here
        CollectiveWaitMeter(clock="host").install(nn.Linear(2, 2))
    assert "rank 1: CollectiveWaitMeter: Linear has no FSDP2 parameter groups" in caplog.text


# ------------------------------------------------ every collective site, on 2 gloo ranks
DELAY_S = 0.5
#: site -> (the torch.distributed functions a rank sleeps in first, or a hook name)
SITES = {
    "all-gather (unshard)": ("all_gather_single", "all_gather_into_tensor"),
    "all-gather waited in wait_for_unshard (async)": (
        "all_gather_single",
        "all_gather_into_tensor",
    ),
    "reduce-scatter (post_backward)": ("reduce_scatter_single", "reduce_scatter_tensor"),
    "root post-backward callback": ("root_callback",),
    "functional all-reduce (DTensor gradient norm)": ("clip",),
    "all_reduce in the step": ("all_reduce",),
    "broadcast in the step (Lightning's SIGTERM flag)": ("broadcast",),
}


def _site_worker(rank: int, init_file: str, out: str) -> None:
    import json
    import os
    import time as clock

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    fully_shard(model[0], mesh=mesh)  # its input needs no gradient: reduced in the callback
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    armed: dict[str, float] = {}  # hook -> seconds to sleep once
    slept: list[float] = []

    def sleep_once(name: str) -> None:
        seconds = armed.pop(name, 0.0)
        if seconds:
            begin = clock.perf_counter()
            clock.sleep(seconds)
            slept.append(clock.perf_counter() - begin)

    def delayed(name: str, function):
        def call(*args, **kwargs):
            sleep_once(name)
            return function(*args, **kwargs)

        return call

    for name in {n for names in SITES.values() for n in names}:
        if callable(getattr(dist, name, None)):
            setattr(dist, name, delayed(name, getattr(dist, name)))
    meter = CollectiveWaitMeter(clock="host").install(model)
    for state in _fsdp_states(model):  # FSDP queues the callback of the first state to see
        callback = state._root_post_backward_final_callback  # backward: the meter's wrapper
        state._root_post_backward_final_callback = delayed("root_callback", callback)

    def step(site: str) -> None:
        if "async" in site:
            model.unshard(async_op=True).wait()
        model(x).sum().backward()
        sleep_once("clip")
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        dist.all_reduce(torch.ones(1))
        dist.broadcast(torch.ones(1), src=0)
        optimizer.step()
        optimizer.zero_grad()

    step("warm-up")
    results = {}
    for site, hooks in SITES.items():
        late = 0 if "broadcast" in site else 1  # a broadcast's source does not wait
        meter.take()
        step(site)
        baseline = meter.take()
        if rank == late:
            armed.update(dict.fromkeys(hooks, DELAY_S))
        slept.clear()
        step(site)
        waited = meter.take() - baseline
        results[site] = {"late": late, "waited": waited, "slept": sum(slept)}
    meter.remove()
    everyone = [None, None]
    dist.all_gather_object(everyone, results)
    if rank == 0:
        with open(out, "w") as file:
            json.dump(everyone, file)
    dist.barrier()
    os._exit(0)  # gloo's teardown at exit can abort ("terminate called without ...")


def test_a_delay_at_every_collective_site_is_waited_for_and_measured_as_wait(tmp_path):
    import json

    import torch.multiprocessing as mp

    out = tmp_path / "sites.json"
    mp.spawn(_site_worker, args=(str(tmp_path / "init"), str(out)), nprocs=2, join=True)
    ranks = json.loads(out.read_text())
    measured = {}
    for site in SITES:
        late = ranks[0][site]["late"]
        measured[site] = (ranks[1 - late][site]["waited"], ranks[late][site]["slept"])
    for site, (waited, slept) in measured.items():  # the other rank waited that long
        assert slept >= DELAY_S and abs(waited - slept) <= 0.1 * slept, (site, measured)
