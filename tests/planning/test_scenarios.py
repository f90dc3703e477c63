"""The scenario matrix: each controller on each cluster of lightning_hetero/planning/scenarios.py.

Each cell states what one controller achieves on one scenario (seed 0): a floor on the
steady-state efficiency, a ceiling on the boundaries it needs to reach efficiency 0.95
after each speed change (``NEVER``: documented not to get there within the run), and a
range of plan changes. The numbers were measured over seeds 0-9 and carry margins, so a
cell fails on a real change of behaviour rather than on the seed. (On "noisy", 10% timing
noise now and then fakes a throughput drop twice in a row, and the proportional controller
caps a rank below its share until the cap is re-tested 10 boundaries later: seeds 16, 17
and 19 of 0-19; seed 17 ends at efficiency 0.938, or 0.943 with Eq. 8, just under the
cells' 0.94, and seed 19 at 0.96.)

To add a controller: one entry in ``FACTORIES`` and one ``EXPECTED`` line per scenario; to
add a scenario, one ``EXPECTED`` line per controller.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from lightning_hetero.planning import StepTimeGuard
from lightning_hetero.planning.base import Controller
from lightning_hetero.planning.lbbsp import LBBSPController
from lightning_hetero.planning.model import ModelController
from lightning_hetero.planning.proportional import ProportionalController
from lightning_hetero.planning.scenarios import SCENARIOS, Scenario, ScenarioReport, run_scenario
from lightning_hetero.planning.stepwise import StepwiseController
from lightning_hetero.planning.updates import UpdatesController

#: The cell says the controller does not reach efficiency 0.95 in some phase of the run.
NEVER = None


@dataclass(frozen=True)
class Expected:
    """What one controller must achieve on one scenario.

    Attributes:
        steady_efficiency: lowest acceptable :attr:`ScenarioReport.steady_efficiency`.
        boundaries_to_balance: most boundaries to reach 0.95 after each speed change, or
            ``NEVER`` when the controller is known not to reach it within the run.
        plan_changes: inclusive range of :attr:`ScenarioReport.plan_changes`.
        stretch: run the scenario this many times longer (speed changes move with it), for
            controllers that are slow by design.
    """

    steady_efficiency: float
    boundaries_to_balance: int | None
    plan_changes: tuple[int, int]
    stretch: int = 1


#: How each controller of the matrix is built.
FACTORIES: dict[str, Callable[[], Controller]] = {
    "proportional": ProportionalController,
    "omnilearn": lambda: ProportionalController(renormalization="omnilearn"),
    "stepwise": StepwiseController,
    "updates": UpdatesController,
    "updates-deadband": lambda: UpdatesController(deadband=0.05),
    "lbbsp": LBBSPController,
    "lbbsp-last": lambda: LBBSPController(predictor="last"),
    "model": ModelController,
    "proportional-auto": lambda: ProportionalController(deadband="auto"),
    "model-auto": lambda: ModelController(deadband="auto"),
}

#: Controllers run as HeteroStrategy runs them by default: every plan change checked
#: against the step time by a :class:`StepTimeGuard` (a fresh one per run).
GUARDED = {"proportional-auto", "model-auto"}

# fmt: off
EXPECTED: dict[tuple[str, str], Expected] = {
    # one plan change to the bounded proportional split, then the dead-band holds it
    ("proportional", "HL2"): Expected(0.97, 1, (1, 2)),
    ("proportional", "HL4"): Expected(0.96, 1, (1, 2)),
    ("proportional", "HL8"): Expected(0.95, 1, (1, 2)),
    ("proportional", "steps"): Expected(0.97, 1, (4, 6)),
    ("proportional", "noisy"): Expected(0.94, 4, (1, 16)),
    ("proportional", "gpu"): Expected(0.96, 1, (1, 3)),
    # the learned-maximum rule caps the rank at 64 (its size before it slowed, under its cap
    # of 96 where the optimum runs it) once the second collapse past its cap confirms the
    # drop, and re-tests the cap every 10 boundaries: two more collapses each time
    ("proportional", "memory"): Expected(0.55, NEVER, (12, 16)),
    # paper 002 Eq. 8: the equal shift over- and under-corrects in turn before settling
    ("omnilearn", "HL2"): Expected(0.96, 1, (1, 2)),
    ("omnilearn", "HL4"): Expected(0.96, 4, (2, 5)),
    ("omnilearn", "HL8"): Expected(0.93, 18, (10, 20)),
    ("omnilearn", "steps"): Expected(0.96, 14, (10, 20)),
    ("omnilearn", "noisy"): Expected(0.94, 9, (2, 24)),
    ("omnilearn", "gpu"): Expected(0.96, 3, (1, 4)),
    ("omnilearn", "memory"): Expected(0.48, NEVER, (13, 18)),
    # 5 samples per 5 boundaries, then 1 per 20: runs stretched to let it get there
    ("stepwise", "HL2"): Expected(0.97, 25, (7, 12), stretch=4),
    ("stepwise", "HL4"): Expected(0.96, 70, (12, 18), stretch=4),
    ("stepwise", "HL8"): Expected(0.95, 155, (24, 30), stretch=8),
    # it never leaves the fine-tune phase: after the first speed change it moves 1 sample
    # per 20 boundaries (paper 001 has no way back to the fast phase)
    ("stepwise", "steps"): Expected(0.62, NEVER, (2, 12)),
    ("stepwise", "noisy"): Expected(0.94, 210, (12, 22), stretch=8),
    ("stepwise", "gpu"): Expected(0.96, 70, (12, 18), stretch=4),
    # the capped rank stops being the leader at 94 samples (memory use 0.98 >= 0.95)
    ("stepwise", "memory"): Expected(0.90, NEVER, (8, 14), stretch=4),
    # no dead-band in paper 004: small moves go on under noise. On HL4 the gain of 0.5 asks
    # for less than half a sample once one sample off (1-2% on a rank of 32-49), which
    # rounding drops: the median of every step leaves no noise to dither the plan on to the
    # optimum, so seeds 0, 3, 4 and 9 of 0-9 stop one sample short (0.98; 1.00 under the
    # EWMA, whose noise moved the plan at random)
    ("updates", "HL2"): Expected(0.98, 4, (3, 15)),
    ("updates", "HL4"): Expected(0.97, 6, (6, 15)),
    ("updates", "HL8"): Expected(0.96, 9, (8, 28)),
    ("updates", "steps"): Expected(0.97, 10, (25, 48)),
    ("updates", "noisy"): Expected(0.94, 9, (15, 30)),
    ("updates", "gpu"): Expected(0.97, 6, (6, 16)),
    # timing alone: the capped rank's time rises past its cap, so it settles at the optimum
    ("updates", "memory"): Expected(0.96, 4, (8, 26)),
    # with HeteroStrategy's dead-band: as fast, about half the plan changes
    ("updates-deadband", "HL2"): Expected(0.96, 4, (2, 5)),
    ("updates-deadband", "HL4"): Expected(0.95, 6, (3, 8)),
    ("updates-deadband", "HL8"): Expected(0.95, 8, (4, 10)),
    ("updates-deadband", "steps"): Expected(0.95, 10, (15, 30)),
    ("updates-deadband", "noisy"): Expected(0.95, 9, (5, 18)),
    ("updates-deadband", "gpu"): Expected(0.96, 6, (3, 8)),
    ("updates-deadband", "memory"): Expected(0.94, 4, (2, 9)),
    # co-located jobs come and go (traces.py): nobody foresees a job that starts next interval.
    # With learn_floor=True (off by default) a job that lands on a rank as its batch shrinks,
    # and stays one more boundary, reads as a per-step floor and holds the rank at its old
    # size for 10 boundaries: 0.81 against 0.84 mean steady efficiency over seeds 0-9.
    # Omnilearn's seed 6 never gets back to 0.95 in one phase.
    ("proportional", "resources"): Expected(0.67, 60, (58, 92)),
    ("omnilearn", "resources"): Expected(0.65, 60, (62, 92)),
    ("stepwise", "resources"): Expected(0.55, NEVER, (2, 8)),
    ("updates", "resources"): Expected(0.75, 8, (90, 100)),
    ("updates-deadband", "resources"): Expected(0.75, 8, (75, 100)),
    # LB-BSP with its default EMA predictor: smooth but lagging (20% of the gap per boundary)
    ("lbbsp", "HL2"): Expected(0.95, 1, (1, 2)),
    ("lbbsp", "HL4"): Expected(0.95, 1, (1, 2)),
    ("lbbsp", "HL8"): Expected(0.95, 1, (1, 2)),
    ("lbbsp", "steps"): Expected(0.93, NEVER, (20, 28)),
    ("lbbsp", "noisy"): Expected(0.94, 2, (1, 3)),
    ("lbbsp", "gpu"): Expected(0.96, 1, (1, 2)),
    ("lbbsp", "memory"): Expected(0.98, 10, (5, 11)),
    ("lbbsp", "resources"): Expected(0.70, 75, (30, 60)),
    # the last speed: recovers in one boundary, but flips the plan where throughput depends
    # on the batch (memory cap)
    ("lbbsp-last", "HL2"): Expected(0.95, 1, (1, 2)),
    ("lbbsp-last", "HL4"): Expected(0.95, 1, (1, 2)),
    ("lbbsp-last", "HL8"): Expected(0.95, 1, (1, 2)),
    ("lbbsp-last", "steps"): Expected(0.97, 1, (4, 5)),
    ("lbbsp-last", "noisy"): Expected(0.94, 2, (1, 8)),
    ("lbbsp-last", "gpu"): Expected(0.96, 1, (1, 2)),
    ("lbbsp-last", "memory"): Expected(0.35, NEVER, (28, 30)),
    # speeds change every interval: seed 0 reached 0.95 at boundary 4 under the EWMA by one
    # sample ([73, 44, 48, 91], 0.956; now [73, 43, 48, 92], 0.946) and next at 29; seeds
    # 1-9 and the mean steady efficiency (0.841) are unchanged
    ("lbbsp-last", "resources"): Expected(0.75, 29, (65, 90)),
    # a fixed cost per step (the "-fixed" scenarios, "gpu-flat"): proportional control reads
    # the fast workers as slower than they are and closes the gap in shrinking steps
    ("proportional", "HL2-fixed"): Expected(0.95, 1, (1, 3)),
    ("proportional", "HL4-fixed"): Expected(0.95, 2, (2, 4)),
    ("proportional", "HL8-fixed"): Expected(0.95, 4, (3, 6)),
    ("proportional", "steps-fixed"): Expected(0.98, 2, (7, 12)),  # fixed costs fitted
    ("proportional", "gpu-flat"): Expected(0.96, 2, (2, 4)),
    # Eq. 8's equal shift overshoots towards the fast workers, which the fixed cost rewards
    ("omnilearn", "HL2-fixed"): Expected(0.97, 1, (1, 3)),
    ("omnilearn", "HL4-fixed"): Expected(0.96, 2, (2, 3)),
    ("omnilearn", "HL8-fixed"): Expected(0.96, 3, (3, 5)),
    ("omnilearn", "steps-fixed"): Expected(0.96, NEVER, (6, 9)),
    ("omnilearn", "gpu-flat"): Expected(0.97, 2, (2, 3)),
    ("stepwise", "HL2-fixed"): Expected(0.98, 20, (8, 11), stretch=4),
    ("stepwise", "HL4-fixed"): Expected(0.98, 60, (14, 17), stretch=4),
    ("stepwise", "HL8-fixed"): Expected(0.98, 105, (24, 29), stretch=8),
    ("stepwise", "steps-fixed"): Expected(0.66, NEVER, (2, 11)),
    ("stepwise", "gpu-flat"): Expected(0.97, 60, (14, 17), stretch=4),
    ("updates", "HL2-fixed"): Expected(0.99, 4, (4, 10)),
    ("updates", "HL4-fixed"): Expected(0.98, 7, (10, 15)),
    ("updates", "HL8-fixed"): Expected(0.98, 11, (14, 23)),
    ("updates", "steps-fixed"): Expected(0.98, 11, (37, 52)),
    ("updates", "gpu-flat"): Expected(0.97, 6, (10, 15)),
    ("updates-deadband", "HL2-fixed"): Expected(0.97, 4, (3, 6)),
    # the plan stops at true balance 0.958, inside the fixed 5% band, on seeds 0-9 (0.957);
    # the EWMA's noise read it below 0.95 once later in the run and moved it on to 0.971
    ("updates-deadband", "HL4-fixed"): Expected(0.95, 7, (6, 10)),
    ("updates-deadband", "HL8-fixed"): Expected(0.95, 11, (10, 15)),
    ("updates-deadband", "steps-fixed"): Expected(0.97, 11, (28, 35)),
    ("updates-deadband", "gpu-flat"): Expected(0.96, 6, (6, 9)),
    # the EMA of speeds that the fixed cost makes depend on the batch: slow to settle
    ("lbbsp", "HL2-fixed"): Expected(0.95, 1, (1, 2)),
    ("lbbsp", "HL4-fixed"): Expected(0.97, 20, (3, 5)),
    ("lbbsp", "HL8-fixed"): Expected(0.93, 20, (5, 9)),
    ("lbbsp", "steps-fixed"): Expected(0.90, NEVER, (28, 36)),
    ("lbbsp", "gpu-flat"): Expected(0.94, 14, (3, 6)),
    ("lbbsp-last", "HL2-fixed"): Expected(0.95, 1, (1, 3)),
    ("lbbsp-last", "HL4-fixed"): Expected(0.95, 2, (2, 4)),
    ("lbbsp-last", "HL8-fixed"): Expected(0.95, 9, (3, 5)),
    ("lbbsp-last", "steps-fixed"): Expected(0.97, 4, (9, 13)),
    ("lbbsp-last", "gpu-flat"): Expected(0.96, 2, (2, 4)),
    # fitted step-time curves: the proportional split first, then the lines' exact optimum;
    # the memory cliff shows as a bend (no learned maximum needed); "gpu-flat" overshoots
    # once (two points on the flat part look nearly free) before the bend is seen
    ("model", "HL2"): Expected(0.98, 1, (1, 2)),
    ("model", "HL4"): Expected(0.98, 1, (1, 2)),
    ("model", "HL8"): Expected(0.98, 1, (1, 2)),
    ("model", "steps"): Expected(0.98, 1, (4, 5)),
    ("model", "noisy"): Expected(0.95, 2, (1, 10)),
    ("model", "gpu"): Expected(0.97, 1, (1, 2)),
    ("model", "memory"): Expected(0.99, 3, (3, 5)),
    ("model", "resources"): Expected(0.75, 18, (60, 95)),
    ("model", "HL2-fixed"): Expected(0.95, 1, (1, 3)),
    ("model", "HL4-fixed"): Expected(0.97, 2, (2, 3)),
    ("model", "HL8-fixed"): Expected(0.96, 2, (2, 3)),
    ("model", "steps-fixed"): Expected(0.98, 2, (7, 9)),
    ("model", "gpu-flat"): Expected(0.97, 3, (3, 4)),
    # equal per-sample loading on the training thread plus a fixed cost per step, on HL4
    # devices: the step times include the loading, so nobody floods the fast worker; the
    # one-shot proportional split stops about 2% short of the optimum
    ("proportional", "loader"): Expected(0.96, 1, (1, 3)),
    ("omnilearn", "loader"): Expected(0.95, 1, (1, 2)),
    ("stepwise", "loader"): Expected(0.95, 45, (9, 13), stretch=4),
    ("updates", "loader"): Expected(0.97, 5, (5, 14)),
    ("updates-deadband", "loader"): Expected(0.94, 5, (3, 7)),
    ("lbbsp", "loader"): Expected(0.94, 1, (1, 2)),
    ("lbbsp-last", "loader"): Expected(0.96, 1, (1, 3)),
    ("model", "loader"): Expected(0.96, 1, (1, 2)),
    # per-step floors: the uniform start is already optimal ("floor") or one split away
    # ("floor-slow"); the floored workers look slow per sample, so the proportional rules
    # move samples onto worker 0, but the fixed point is where it reaches the 1.5 s floor:
    # no controller overshoots it in the simulator (stepwise, stretched, drifts 2% past).
    # (ProportionalController(learn_floor=True) would hold the floored workers at 64 instead:
    # more plan changes for the same efficiency here; it is off by default)
    ("proportional", "floor"): Expected(0.98, 0, (2, 6)),
    ("omnilearn", "floor"): Expected(0.98, 0, (2, 5)),
    ("stepwise", "floor"): Expected(0.98, 0, (5, 7)),
    ("updates", "floor"): Expected(0.98, 0, (14, 20)),
    ("updates-deadband", "floor"): Expected(0.98, 0, (8, 13)),
    ("lbbsp", "floor"): Expected(0.98, 0, (3, 6)),
    ("lbbsp-last", "floor"): Expected(0.98, 0, (2, 5)),
    ("model", "floor"): Expected(0.98, 0, (1, 3)),
    ("proportional", "floor-slow"): Expected(0.98, 1, (4, 11)),
    ("omnilearn", "floor-slow"): Expected(0.98, 1, (3, 6)),
    ("stepwise", "floor-slow"): Expected(0.96, 30, (16, 20), stretch=4),
    ("updates", "floor-slow"): Expected(0.98, 2, (15, 22)),
    ("updates-deadband", "floor-slow"): Expected(0.98, 2, (9, 14)),
    ("lbbsp", "floor-slow"): Expected(0.98, 1, (3, 6)),
    ("lbbsp-last", "floor-slow"): Expected(0.98, 1, (3, 6)),
    ("model", "floor-slow"): Expected(0.98, 1, (1, 3)),
    # HeteroStrategy's defaults: a dead-band that follows the measured timing noise (at
    # least 1%), and a StepTimeGuard that checks every change against the mean step time
    # of the fastest plan measured and reverts it when steps got slower by more than 2
    # standard errors + 0.5%; after a revert, steps shrink by half. The narrower dead-band
    # gets within 1% of the optimum for a few more plan changes (reverts count); on
    # "memory" a collapse past the cap is undone after one boundary and re-tried at half
    # the step (seed 5 then gets to 0.95, after 14 boundaries).
    ("proportional-auto", "HL2"): Expected(0.98, 1, (1, 12)),
    ("proportional-auto", "HL4"): Expected(0.97, 1, (1, 8)),
    ("proportional-auto", "HL8"): Expected(0.97, 1, (1, 8)),
    # (issue 42: the guard and the evidence-sized moves make 5 changes on seed 0)
    ("proportional-auto", "steps"): Expected(0.98, 2, (5, 20)),
    ("proportional-auto", "noisy"): Expected(0.93, 8, (1, 10)),
    ("proportional-auto", "gpu"): Expected(0.98, 1, (1, 12)),
    ("proportional-auto", "memory"): Expected(0.65, NEVER, (8, 28)),
    # learned floors as for "proportional" above; seed 2 never gets back to 0.95 in one phase
    ("proportional-auto", "resources"): Expected(0.68, 40, (58, 100)),
    ("proportional-auto", "HL2-fixed"): Expected(0.98, 1, (1, 12)),
    ("proportional-auto", "HL4-fixed"): Expected(0.97, 2, (3, 10)),
    ("proportional-auto", "HL8-fixed"): Expected(0.98, 4, (5, 11)),
    ("proportional-auto", "steps-fixed"): Expected(0.97, 2, (10, 30)),  # fixed costs fitted
    ("proportional-auto", "gpu-flat"): Expected(0.97, 2, (2, 10)),
    ("proportional-auto", "loader"): Expected(0.97, 1, (1, 10)),
    ("proportional-auto", "floor"): Expected(0.98, 0, (4, 20)),
    ("proportional-auto", "floor-slow"): Expected(0.98, 1, (7, 24)),
    ("model-auto", "HL2"): Expected(0.98, 1, (1, 5)),
    ("model-auto", "HL4"): Expected(0.97, 1, (1, 4)),
    ("model-auto", "HL8"): Expected(0.97, 1, (1, 3)),
    ("model-auto", "steps"): Expected(0.98, 8, (4, 12)),
    ("model-auto", "noisy"): Expected(0.93, 11, (1, 7)),
    ("model-auto", "gpu"): Expected(0.98, 1, (1, 5)),
    ("model-auto", "memory"): Expected(0.98, 6, (6, 13)),
    # worse than "model" here (seed 0: 0.77 and 43 boundaries to 0.95, against 0.79 and 15)
    ("model-auto", "resources"): Expected(0.68, 60, (65, 100)),
    ("model-auto", "HL2-fixed"): Expected(0.97, 1, (1, 6)),
    ("model-auto", "HL4-fixed"): Expected(0.97, 2, (1, 5)),
    ("model-auto", "HL8-fixed"): Expected(0.97, 2, (1, 6)),
    ("model-auto", "steps-fixed"): Expected(0.98, 3, (7, 16)),
    ("model-auto", "gpu-flat"): Expected(0.96, 3, (2, 8)),
    ("model-auto", "loader"): Expected(0.98, 1, (1, 4)),
    ("model-auto", "floor"): Expected(0.98, 0, (5, 20)),
    ("model-auto", "floor-slow"): Expected(0.97, 1, (4, 15)),
    # issue 33's busy node: speeds 1 : 1/1.5 under 200 ms stalls on 15% of steps; the plan
    # follows the speeds in one change and the stalls move it no more
    ("proportional", "noisy-node"): Expected(0.99, 1, (1, 2)),
    ("omnilearn", "noisy-node"): Expected(0.99, 1, (1, 2)),
    ("stepwise", "noisy-node"): Expected(0.91, 6, (1, 6)),
    ("updates", "noisy-node"): Expected(0.99, 3, (1, 5)),
    ("updates-deadband", "noisy-node"): Expected(0.99, 3, (1, 5)),
    ("lbbsp", "noisy-node"): Expected(0.99, 1, (1, 2)),
    ("lbbsp-last", "noisy-node"): Expected(0.99, 1, (1, 2)),
    ("model", "noisy-node"): Expected(0.99, 1, (1, 2)),
    ("proportional-auto", "noisy-node"): Expected(0.99, 1, (1, 2)),
    ("model-auto", "noisy-node"): Expected(0.99, 1, (1, 2)),
}
# fmt: on


def stretched(scenario: Scenario, factor: int) -> Scenario:
    """The same scenario run ``factor`` times longer, its speed changes moved along."""
    if factor == 1:
        return scenario

    def build(seed: int):  # type: ignore[no-untyped-def]
        sim = scenario.build(seed)
        sim.speed_changes = {b * factor: s for b, s in sim.speed_changes.items()}
        sim.availability = {b * factor: r for b, r in sim.availability.items()}
        return sim

    return replace(
        scenario,
        build=build,
        boundaries=scenario.boundaries * factor,
        changes=tuple(c * factor for c in scenario.changes),
    )


def run_cell(controller: str, scenario: str, seed: int = 0) -> ScenarioReport:
    """Run one cell of the matrix."""
    expected = EXPECTED[controller, scenario]
    return run_scenario(
        stretched(SCENARIOS[scenario], expected.stretch),
        FACTORIES[controller](),
        seed,
        guard=StepTimeGuard() if controller in GUARDED else None,
    )


def test_matrix_covers_every_controller_on_every_scenario() -> None:
    assert set(EXPECTED) == {(c, s) for c in FACTORIES for s in SCENARIOS}


@pytest.mark.filterwarnings("ignore:Rank .* is the straggler")
@pytest.mark.filterwarnings("ignore:hetero. Rank .*'s batch size is capped")
@pytest.mark.filterwarnings("ignore:hetero. Rank .*'s step time hardly falls")
@pytest.mark.parametrize(
    ("controller", "scenario"), list(EXPECTED), ids=[f"{c}-{s}" for c, s in EXPECTED]
)
def test_controller_meets_its_expectations_on_scenario(controller: str, scenario: str) -> None:
    expected = EXPECTED[controller, scenario]
    report = run_cell(controller, scenario)
    summary = (
        f"efficiency {report.steady_efficiency:.3f}, to 0.95 {report.boundaries_to_balance},"
        f" changes {report.plan_changes}"
    )
    assert report.steady_efficiency >= expected.steady_efficiency, summary
    if expected.boundaries_to_balance is NEVER:
        assert report.boundaries_to_balance is None, f"now reaches 0.95: update the cell; {summary}"
    else:
        assert report.boundaries_to_balance is not None, summary
        assert report.boundaries_to_balance <= expected.boundaries_to_balance, summary
    low, high = expected.plan_changes
    assert low <= report.plan_changes <= high, summary


def test_stretched_scenario_moves_speed_changes_along() -> None:
    scenario = stretched(SCENARIOS["steps"], 3)
    assert scenario.boundaries == 3 * SCENARIOS["steps"].boundaries
    assert scenario.changes == tuple(3 * c for c in SCENARIOS["steps"].changes)
    sim, original = scenario.build(0), SCENARIOS["steps"].build(0)
    assert sim.speeds_at(3 * 15) == original.speeds_at(15)
    assert sim.speeds_at(3 * 15 - 1) == original.speeds_at(14)
