"""Named simulated clusters every controller is judged on, and the numbers that judge it.

The unit tests and ``python -m lightning_hetero.bench --simulate`` read the same
catalogue, so the table a user sees is the one the tests check.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import fmean

from lightning_hetero.planning.base import BatchLimits, Controller
from lightning_hetero.planning.guard import StepTimeGuard
from lightning_hetero.planning.simulator import (
    HETEROGENEITY_LEVELS,
    ClusterSimulator,
    SimulatedWorker,
    SimulationResult,
)
from lightning_hetero.planning.split import check_plan
from lightning_hetero.planning.traces import resource_simulator

__all__ = ["SCENARIOS", "Scenario", "ScenarioReport", "run_scenario"]

_B = 256
_UNIFORM = [_B // 4] * 4


def _relative(cores: tuple[int, ...]) -> list[float]:
    return [c / 12 for c in cores]


@dataclass(frozen=True)
class Scenario:
    """A simulated cluster, its starting plan and how long to run it.

    Attributes:
        name: key in ``SCENARIOS``.
        description: one line for tables.
        build: ``seed -> ClusterSimulator``.
        batch_sizes: the initial plan.
        limits: the global batch and bounds.
        boundaries: boundaries to simulate.
        steps_per_boundary: steps between boundaries.
        changes: boundaries at which the true speeds change (0 is the start).
    """

    name: str
    description: str
    build: Callable[[int], ClusterSimulator]
    batch_sizes: list[int]
    limits: BatchLimits
    boundaries: int
    steps_per_boundary: int = 20
    changes: tuple[int, ...] = (0,)


def _static(level: str) -> Scenario:
    speeds = HETEROGENEITY_LEVELS[level]
    return Scenario(
        level,
        f"{level} {':'.join(map(str, speeds))}, uniform start, 2% noise",
        lambda seed: ClusterSimulator.from_speeds(speeds, noise=0.02, seed=seed),
        _UNIFORM,
        BatchLimits.build(4, _B),
        boundaries=30,
    )


def _steps() -> Scenario:
    levels = ["HL1", "HL2", "HL4", "HL8", "HL1"]
    every = 15
    changes = {i * every: _relative(HETEROGENEITY_LEVELS[lvl]) for i, lvl in enumerate(levels)}
    return Scenario(
        "steps",
        "HL1 -> HL2 -> HL4 -> HL8 -> HL1, a change every 15 boundaries, 2% noise",
        lambda seed: ClusterSimulator.from_speeds(
            [1.0] * 4, noise=0.02, speed_changes=changes, seed=seed
        ),
        _UNIFORM,
        BatchLimits.build(4, _B),
        boundaries=every * len(levels),
        changes=tuple(changes),
    )


def _steps_fixed() -> Scenario:
    # "steps" with a fixed cost of 30% of the uniform step's per-sample time; a worker's
    # speed scales its whole curve, the fixed part included.
    levels = ["HL1", "HL2", "HL4", "HL8", "HL1"]
    every = 15
    changes = {i * every: _relative(HETEROGENEITY_LEVELS[lvl]) for i, lvl in enumerate(levels)}
    overhead_s = 0.3 * (_B // 4) * 0.01
    return Scenario(
        "steps-fixed",
        f"steps, plus a fixed {overhead_s:.2f} s per step (30% of the per-sample time at the"
        " uniform plan) that scales with the speed, 2% noise",
        lambda seed: ClusterSimulator.from_speeds(
            [1.0] * 4, overhead_s=overhead_s, noise=0.02, speed_changes=changes, seed=seed
        ),
        _UNIFORM,
        BatchLimits.build(4, _B),
        boundaries=every * len(levels),
        changes=tuple(changes),
    )


def _noisy() -> Scenario:
    speeds = HETEROGENEITY_LEVELS["HL4"]
    return Scenario(
        "noisy",
        "HL4 with 10% per-step timing noise",
        lambda seed: ClusterSimulator.from_speeds(speeds, noise=0.10, seed=seed),
        _UNIFORM,
        BatchLimits.build(4, _B),
        boundaries=30,
    )


def _gpu() -> Scenario:
    # Flat below 24 samples (device not full), linear above, plus a fixed launch cost.
    speeds = HETEROGENEITY_LEVELS["HL4"]
    workers = [SimulatedWorker(0.01 * 24 / s, 0.02 * 24 / s, saturation_batch=24) for s in speeds]
    return Scenario(
        "gpu",
        "HL4, GPU-like curves: flat below 24 samples, 2% noise",
        lambda seed: ClusterSimulator(workers, noise=0.02, seed=seed),
        _UNIFORM,
        BatchLimits.build(4, _B),
        boundaries=30,
    )


def _memory() -> Scenario:
    # HL8, but the fastest worker thrashes above 96 samples (its fair share is 160): each
    # sample over the cap costs 20x, more than on any other worker, so the best plan stops
    # near the cap.
    speeds = HETEROGENEITY_LEVELS["HL8"]
    caps: list[int | None] = [None, None, None, 96]
    workers = [
        SimulatedWorker(0.01 * 32 / s, memory_cap=cap, over_cap_slowdown=20.0)
        for s, cap in zip(speeds, caps, strict=True)
    ]
    return Scenario(
        "memory",
        "HL8, the fastest worker slows 20x per sample above 96 samples",
        lambda seed: ClusterSimulator(workers, noise=0.02, seed=seed),
        _UNIFORM,
        BatchLimits.build(4, _B),
        boundaries=30,
    )


def _fixed(level: str, fraction: float) -> Scenario:
    # A per-step cost that does not shrink with the batch (launches, optimizer, framework
    # loop, an all-reduce the compute timer sees), the same on every worker: ``fraction`` of
    # the slowest worker's per-sample time at the uniform plan (a share f / (1 + f) of its
    # step). Proportional control reads the fast workers, whose steps are short, as slower
    # than they are.
    speeds = HETEROGENEITY_LEVELS[level]
    overhead_s = fraction * (_B // 4) * 0.01 * max(speeds) / min(speeds)
    return Scenario(
        f"{level}-fixed",
        f"{level} plus a fixed {overhead_s:.2f} s per step on every worker ({fraction:.0%} of"
        " the slowest one's per-sample time at the uniform plan), 2% noise",
        lambda seed: ClusterSimulator.from_speeds(
            speeds, overhead_s=overhead_s, noise=0.02, seed=seed
        ),
        _UNIFORM,
        BatchLimits.build(4, _B),
        boundaries=30,
    )


def _saturated() -> Scenario:
    # Workers sharing a GPU (MPS shares 9:9:6:24): each runs batches below 3/4 of its fair
    # share (the fastest below 96 samples) no faster than at that size, plus a fixed cost of
    # 10% of the slowest one's per-sample time at the uniform plan. The uniform start sits in
    # the fastest worker's flat part, so its first timing understates its speed.
    speeds = HETEROGENEITY_LEVELS["HL4"]
    overhead_s = 0.1 * 64 * 0.01 * 24 / 6
    workers = [
        SimulatedWorker(0.01 * 24 / s, overhead_s, saturation_batch=round(96 * s / 24))
        for s in speeds
    ]
    return Scenario(
        "gpu-flat",
        f"HL4 GPU shares: flat below 3/4 of the fair share (96 on the fastest), a fixed"
        f" {overhead_s:.2f} s per step (10% of the slowest one's per-sample time), 2% noise",
        lambda seed: ClusterSimulator(workers, noise=0.02, seed=seed),
        _UNIFORM,
        BatchLimits.build(4, _B),
        boundaries=30,
    )


def _loader() -> Scenario:
    # What a real program costs with DataLoader(num_workers=0): per-sample loading on the
    # training thread, the same on every worker (a faster device does not load faster),
    # device work that differs by worker (HL4), and a fixed cost per step. Measured without
    # the loading, the fast worker looks even faster and gets flooded.
    speeds = HETEROGENEITY_LEVELS["HL4"]
    load_s, overhead_s = 0.01, 0.1
    workers = [SimulatedWorker(0.01 * 24 / s, overhead_s, load_s=load_s) for s in speeds]
    return Scenario(
        "loader",
        f"HL4 devices, {load_s * 1e3:.0f} ms per sample of loading on the training thread on"
        f" every worker, a fixed {overhead_s:.1f} s per step, 2% noise",
        lambda seed: ClusterSimulator(workers, noise=0.02, seed=seed),
        _UNIFORM,
        BatchLimits.build(4, _B),
        boundaries=30,
    )


def _floor(slow: bool) -> Scenario:
    # Workers with a per-step floor that no batch below 75 samples moves (a GPU share that
    # takes as long for 10 samples as for 64). Their timings make them look slow per sample,
    # so a proportional split keeps emptying them and floods the others, past the floor's
    # time: without a check of each change against the step time, steps end slower than at
    # the uniform start. "floor": three floored workers and a fast one (the uniform plan is
    # already optimal); "floor-slow": two floored, a fast and a slow one (a better split
    # exists).
    last = SimulatedWorker(0.04) if slow else SimulatedWorker(0.02, floor_s=1.5)
    floored = [SimulatedWorker(0.02, floor_s=1.5)] * 2
    workers = [SimulatedWorker(0.01), *floored, last]
    name = "floor-slow" if slow else "floor"
    what = (
        "1 and 2 never faster than 1.5 s per step, 40 ms per sample on 3"
        if slow
        else ("1-3 never faster than 1.5 s per step")
    )
    return Scenario(
        name,
        f"per-sample 10 ms on worker 0, 20 ms on 1-2; {what} (a floor), 2% noise; best step"
        f" 1.5 s, uniform {max(w.step_s(_B // 4) for w in workers):.2f} s",
        lambda seed: ClusterSimulator(workers, noise=0.02, seed=seed),
        _UNIFORM,
        BatchLimits.build(4, _B),
        boundaries=30,
    )


def _resources() -> Scenario:
    # Paper 001's shared CPU hosts: co-located jobs take CPU and memory, the readings come
    # in RankStats (lightning_hetero/planning/traces.py). Speeds change often.
    boundaries = 100
    return Scenario(
        "resources",
        "HL2 hosts shared with co-located jobs and hiccups; CPU/memory readings, 2% noise",
        lambda seed: resource_simulator(seed, boundaries=boundaries),
        _UNIFORM,
        BatchLimits.build(4, _B),
        boundaries=boundaries,
    )


def _noisy_node() -> Scenario:
    # A busy shared node (issue 33): the second of two ranks is 1.5x slower per sample, and
    # each rank stalls 200 ms on 15% of its steps (other jobs' bursts), several times the
    # timing noise. The plan should follow the speeds, not the stalls.
    return Scenario(
        "noisy-node",
        "2 ranks, 1 : 1.5 per-sample time, 200 ms stalls on 15% of steps, 2% noise",
        lambda seed: ClusterSimulator(
            [SimulatedWorker(0.01), SimulatedWorker(0.015)],
            noise=0.02,
            stalls=(0.15, 0.2),
            seed=seed,
        ),
        [32, 32],
        BatchLimits.build(2, 64),
        boundaries=30,
    )


#: The catalogue, by name.
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        _static("HL2"),
        _static("HL4"),
        _static("HL8"),
        _steps(),
        _noisy(),
        _gpu(),
        _memory(),
        _resources(),
        _noisy_node(),
        _fixed("HL2", 0.1),
        _fixed("HL4", 0.2),
        _fixed("HL8", 0.3),
        _steps_fixed(),
        _saturated(),
        _loader(),
        _floor(slow=False),
        _floor(slow=True),
    ]
}


@dataclass
class ScenarioReport:
    """How one controller did on one scenario.

    *Efficiency* is the optimal step time (the best any plan within the limits can do on
    the noise-free curves,
    [`ClusterSimulator.optimal_step_s`][lightning_hetero.planning.ClusterSimulator.optimal_step_s])
    over the true step
    time of the plan in force. For linear workers without caps it equals the balance
    efficiency ``E``; where ``E = 1`` is out of reach (a memory cap, a flat GPU curve) it
    still reads 1.0 at the best plan.

    Attributes:
        steady_balance: mean true balance efficiency ``E`` over the last quarter of every phase.
        steady_efficiency: mean efficiency over the last quarter of every phase.
        boundaries_to_balance: the worst, over the phases, of the boundaries from a speed
            change until the efficiency first reaches ``threshold``; ``None`` if some phase
            never got there.
        plan_changes: boundaries at which the plan changed, over the whole run.
        mean_step_s: mean true (noise-free) step time, ``max_k t_k``, over the run.
        run_efficiency: the optimal step time summed over the run, over the true step time
            summed over the run: the fraction of the best possible speed the controller
            delivered, convergence included.
    """

    scenario: str
    controller: str
    seed: int
    steady_balance: float
    steady_efficiency: float
    boundaries_to_balance: int | None
    plan_changes: int
    mean_step_s: float
    run_efficiency: float
    result: SimulationResult = field(repr=False)


def run_scenario(
    scenario: Scenario | str,
    controller: Controller,
    seed: int = 0,
    threshold: float = 0.95,
    guard: StepTimeGuard | None = None,
) -> ScenarioReport:
    """Run ``controller`` through ``scenario`` and score it; with ``guard``, every plan
    change is checked against the step time and reverted if slower, as in ``mode="bsp"``.

    Every plan is checked against the scenario's limits (sum and bounds); a violation
    raises [`PlanError`][lightning_hetero.planning.PlanError].

    Example:
        >>> from lightning_hetero.planning import ProportionalController
        >>> report = run_scenario("HL4", ProportionalController())
        >>> report.boundaries_to_balance, report.steady_balance > 0.95
        (1, True)
    """
    if isinstance(scenario, str):
        try:
            scenario = SCENARIOS[scenario]
        except KeyError:
            raise ValueError(
                f"Unknown scenario {scenario!r}; expected one of {sorted(SCENARIOS)}."
            ) from None
    sim = scenario.build(seed)
    limits = scenario.limits
    result = sim.run(
        controller,
        scenario.batch_sizes,
        limits,
        scenario.boundaries,
        scenario.steps_per_boundary,
        guard=guard,
    )
    for plan in result.plans:
        check_plan(
            plan, len(plan), limits.global_batch_size, limits.min_batch_size, limits.max_batch_size
        )

    step_s = [max(sim.true_step_s(plan, i)) for i, plan in enumerate(result.plans)]
    optimal = [sim.optimal_step_s(limits, i) for i in range(len(step_s))]
    efficiency = [best / t for best, t in zip(optimal, step_s, strict=True)]
    ends = [*scenario.changes[1:], scenario.boundaries]
    steady: list[int] = []
    worst: int | None = 0
    for start, end in zip(scenario.changes, ends, strict=True):
        steady.extend(range(end - max(1, (end - start) // 4), end))
        phase = efficiency[start:end]
        reached = next((i for i, e in enumerate(phase) if e >= threshold - 1e-12), None)
        worst = None if reached is None or worst is None else max(worst, reached)
    return ScenarioReport(
        scenario=scenario.name,
        controller=getattr(controller, "name", type(controller).__name__),
        seed=seed,
        steady_balance=fmean(result.balance[i] for i in steady),
        steady_efficiency=fmean(efficiency[i] for i in steady),
        boundaries_to_balance=worst,
        plan_changes=result.adjustments,
        mean_step_s=fmean(step_s),
        run_efficiency=sum(optimal) / sum(step_s),
        result=result,
    )
