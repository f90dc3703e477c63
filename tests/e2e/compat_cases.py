"""The compatibility matrix's case table (issue 40, item 6): each option set of the strategies
against the Lightning features programs combine, with the outcome each cell must have. Pure
data: ``compat_matrix.py`` runs the cells (one 2-rank gloo launch), ``test_compatibility.py``
asserts each outcome, and :func:`render_markdown` writes docs/compatibility.md from the same
table (``tests/test_docs.py`` checks that the committed page is what it renders).

An outcome is ``"works"`` (every rank finishes, every sample is trained exactly once per epoch,
and where the option set is exact the parameters, and the logged metrics where ``exact`` says
so, equal a DDP run's with the same accumulation to 1e-5), ``"refused: <substring>"`` (the
combination is refused at construction or set-up with a message holding the substring) or
``"xfail: <reason>"`` (fails today, for the reason given: listed, never dropped).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class OptionSet:
    """One way to configure the strategy; ``code`` is what the docs show."""

    name: str
    code: str
    #: what the cells compare with DDP's run: "all" (parameters and logged metrics), "params"
    #: or "" (finishes and trains every sample once per epoch only)
    exact: str
    #: the Trainer's accumulate_grad_batches (the DDP reference run uses the same)
    accumulate: int = 1
    #: why the logged metrics are not compared (where ``exact`` is "params")
    why: str = ""


#: why micro-batches' logged step values are not DDP's (accumulate 1) run's
MICRO_LOG = (
    "a step's logged value is its last micro-batch's on each rank, synced weighted by"
    " samples, as DDP with accumulation logs its last accumulated batch's"
)

OPTION_SETS = {
    s.name: s
    for s in (
        OptionSet("bsp", 'HeteroStrategy(controller="static", batch_sizes=[6, 2])', "all"),
        OptionSet(
            "accumulate",
            "HeteroStrategy(max_batch_size=[12, 4]) + Trainer(accumulate_grad_batches=2)",
            "all",
            accumulate=2,
        ),
        OptionSet(
            "global_micro",
            'HeteroStrategy(controller="static", batch_sizes=[6, 2], global_batch_size=8,'
            " micro_batch_size=2)",
            "params",
            why=MICRO_LOG,
        ),
        OptionSet(
            "micro_auto",
            'HeteroStrategy(controller="static", batch_sizes=[6, 2], micro_batch_size="auto")',
            "params",
            why=MICRO_LOG,
        ),
        OptionSet(
            "async", 'HeteroStrategy(mode="async", controller="static", batch_sizes=[6, 2])', ""
        ),
        OptionSet(
            "local", 'HeteroStrategy(mode="local", controller="static", batch_sizes=[6, 2])', ""
        ),
        OptionSet("dual", 'HeteroStrategy(mode="async", controller="dual")', ""),
        OptionSet("dual_bsp", 'HeteroStrategy(controller="dual")', ""),
        OptionSet("fsdp", 'HeteroFSDPStrategy(controller="static", batch_sizes=[6, 2])', "all"),
        OptionSet(
            "fsdp_micro",
            'HeteroFSDPStrategy(controller="static", batch_sizes=[6, 2], micro_batch_size=2)',
            "params",
            why=MICRO_LOG,
        ),
    )
}

#: Lightning features: what the cell's program does (docs column).
FEATURES = {
    "log_step": "`self.log(...)` in `training_step`, on step, no sync",
    "log_step_sync": "`self.log(..., sync_dist=True)` on step",
    "log_epoch": "`self.log(..., on_epoch=True, sync_dist=True)`",
    "val_float": "`val_check_interval=0.5`",
    "val_int": "`val_check_interval=2`",
    "val_every_n_epoch": "`check_val_every_n_epoch=2` (2 epochs)",
    "limit_float": "`limit_train_batches=0.5`, `limit_val_batches=0.5`",
    "limit_int": "`limit_train_batches=3`, `limit_val_batches=1`",
    "max_steps": "`max_steps=3`",
    "log_every_n_steps": "`log_every_n_steps=2`",
    "checkpoint": "`ModelCheckpoint(every_n_train_steps=2, save_last=True)`",
    "early_stopping": "`EarlyStopping(monitor='val_loss')` (3 epochs)",
    "scheduler_step": 'a `StepLR` with `interval="step"`',
    "accumulation_scheduler": "`GradientAccumulationScheduler({0: 2})`",
    "swa": "`StochasticWeightAveraging(swa_epoch_start=1)` (2 epochs)",
    "optimizer_step": "`optimizer_step` override: runs the closure, then steps",
    "batchnorm": "a `BatchNorm1d` layer",
    "metric_sync": "a torchmetrics metric logged on epoch (synced at compute)",
    "metric_step_sync": "a torchmetrics metric with `dist_sync_on_step=True`",
    "all_reduce": "the user's own `all_reduce` in `training_step`",
    "clipping": "`gradient_clip_val=0.5`",
    "bf16": '`precision="bf16-mixed"`',
    "manual": "manual optimization",
    "two_optimizers": "two optimizers (manual optimization)",
    "iterable": "an `IterableDataset` (sharded by rank)",
}

W = "works"
#: features whose cells are not compared with DDP's numbers whatever the option set, and why
INEXACT = {
    "batchnorm": "BatchNorm's statistics are each rank's batch's, which differ from DDP's",
    "bf16": "bf16 rounds each rank's unequal batch otherwise than DDP's equal ones",
}


@dataclass(frozen=True)
class Case:
    options: str
    feature: str
    expect: str = W
    #: why this cell is not compared with DDP's numbers (besides :data:`INEXACT`)
    inexact: str = ""

    @property
    def id(self) -> str:
        return f"{self.options}-{self.feature}"

    @property
    def compare(self) -> str:
        """What the cell compares with DDP's run (see ``OptionSet.exact``)."""
        if self.inexact or self.feature in INEXACT:
            return ""
        return OPTION_SETS[self.options].exact


def _row(options: str, features: tuple[str, ...], expect=None, inexact=None) -> list[Case]:
    """The cells of ``options`` with ``features``: each works unless ``expect`` says otherwise;
    ``inexact``: the features not compared with DDP's numbers in this row, and why."""
    expect, inexact = expect or {}, inexact or {}
    return [Case(options, f, expect.get(f, W), inexact.get(f, "")) for f in features]


ALL = tuple(FEATURES)
#: the features every micro-batching option set is tried with
MICRO = (
    "log_step",
    "log_step_sync",
    "log_epoch",
    "val_float",
    "val_int",
    "val_every_n_epoch",
    "limit_float",
    "limit_int",
    "max_steps",
    "log_every_n_steps",
    "checkpoint",
    "early_stopping",
    "scheduler_step",
    "accumulation_scheduler",
    "swa",
    "optimizer_step",
    "batchnorm",
    "metric_sync",
    "metric_step_sync",
    "all_reduce",
    "clipping",
    "manual",
    "iterable",
)
SHORT = ("log_step_sync", "log_epoch", "val_int", "max_steps", "checkpoint", "manual")
FSDP = (
    "log_step_sync",
    "val_float",
    "max_steps",
    "checkpoint",
    "clipping",
    "accumulation_scheduler",
    "batchnorm",
    "optimizer_step",
    "all_reduce",
)

ITERABLE = "refused: it is an IterableDataset, which hands each rank an equal share itself"
#: a collective in training_step under unequal micro-batch counts (issue 40, item 2)
ALL_REDUCE = "refused: `torch.distributed.all_reduce` was called inside a"  # on every rank: no hang
#: ranks that make different numbers of steps per epoch (local SGD, dual batch) cannot
#: sync on a step, nor save on one
UNEVEN_SYNC = "refused: cannot be synced on the step: log it with `on_step=False, on_epoch=True`"
UNEVEN_CHECKPOINT = (
    "refused: remove ModelCheckpoint(every_n_train_steps=2) from the Trainer (a"
    " ModelCheckpoint can save on epochs or on validation instead)"
)

CASES: tuple[Case, ...] = tuple(
    [
        *_row("bsp", ALL, {"iterable": ITERABLE}),
        *_row(
            "accumulate",
            MICRO,
            {
                "limit_float": W,
                "accumulation_scheduler": "refused: You have set `accumulate_grad_batches` and"
                " are using the `GradientAccumulationScheduler`",
                "manual": "refused: Automatic gradient accumulation is not supported for"
                " manual optimization",
                "all_reduce": ALL_REDUCE,
                "iterable": ITERABLE,
            },
        ),
        *_row(
            "global_micro",
            MICRO,
            {
                "accumulation_scheduler": "refused: would accumulate several such steps again, by"
                " epoch. Remove the callback and plan each epoch's optimizer step as one global"
                " batch",
                "manual": "refused: Remove `micro_batch_size` and cut the batch in your"
                " `training_step`",
                "all_reduce": ALL_REDUCE,
                "iterable": ITERABLE,
            },
        ),
        *_row("micro_auto", ("log_step_sync", "val_float", "checkpoint", "batchnorm")),
        *_row("async", SHORT),
        *_row(
            "local",
            SHORT,
            {
                "log_step_sync": UNEVEN_SYNC,
                "checkpoint": UNEVEN_CHECKPOINT,
                "val_int": "refused: remove val_check_interval=2 from the Trainer",
                "max_steps": "refused: remove max_steps=3 from the Trainer",
            },
        ),
        *_row(
            "dual",
            SHORT,
            {
                "log_step_sync": UNEVEN_SYNC,
                "checkpoint": UNEVEN_CHECKPOINT,
                "val_int": "refused: remove val_check_interval=2 from the Trainer",
                "max_steps": "refused: remove max_steps=3 from the Trainer",
                "manual": "refused: controller='dual' runs training steps itself and needs"
                " automatic optimization",
            },
        ),
        *_row(
            "dual_bsp",
            ("log_step",),
            {"log_step": "refused: use mode='async' with controller='dual'"},
        ),
        *_row("fsdp", FSDP),
        *_row(
            "fsdp_micro",
            FSDP,
            {
                "accumulation_scheduler": "refused: would accumulate several such steps again, by"
                " epoch. Remove the callback and plan each epoch's optimizer step as one global"
                " batch",
                "all_reduce": ALL_REDUCE,
            },
        ),
    ]
)

_INTRO = """\
# Compatibility matrix

Each option set of the strategies against the Lightning features programs combine, run on
2 gloo ranks with an unequal plan (the matrix test, `tests/e2e/test_compatibility.py`, runs
every cell in one launch, each a short fit of a tiny model; a collective that waits more
than 30 s fails the cell, and a cell that aborts the launch is recorded and the next launch
goes on after it). A cell **works** when
every rank finishes and every sample is trained exactly once per epoch, and, where the
option set is exact, the parameters (and, where marked, the logged metrics) equal those of a
DDP run with the same accumulation to 1e-5. **Refused** cells are refused at construction or
set-up with a message that names the feature and says what to do instead; the column quotes
it. **Fails today** cells are known failures, listed with the reason.

This page is generated from the test's case table (`tests/e2e/compat_cases.py`:
`python -m tests.e2e.compat_cases` rewrites it); `tests/test_docs.py` fails when the two
differ.
"""


def outcome_text(expect: str) -> str:
    """The docs' words for a case's expected outcome."""
    kind, _, detail = expect.partition(": ")
    if kind == "works":
        return "works"
    if kind == "refused":
        return f"refused: “{detail}”"
    return f"fails today: {detail}"


def render_markdown() -> str:
    """docs/compatibility.md, from :data:`CASES`."""
    compared = {"all": "parameters and logged metrics", "params": "parameters", "": "no"}
    lines = [
        _INTRO,
        "## Option sets",
        "",
        "| name | strategy | compared with DDP |",
        "| --- | --- | --- |",
    ]
    for s in OPTION_SETS.values():
        why = f" (not the logged metrics: {s.why})" if s.why else ""
        lines.append(f"| `{s.name}` | `{s.code}` | {compared[s.exact]}{why} |")
    works = sum(c.expect == W for c in CASES)
    refused = sum(c.expect.startswith("refused") for c in CASES)
    lines += [
        "",
        "## Cells",
        "",
        f"{len(CASES)} cells: {works} work, {refused} are refused,"
        f" {len(CASES) - works - refused} fail today.",
    ]
    for s in OPTION_SETS.values():
        lines += ["", f"### `{s.name}`", "", "| feature | outcome |", "| --- | --- |"]
        for case in CASES:
            if case.options == s.name:
                text = outcome_text(case.expect)
                why = case.inexact or INEXACT.get(case.feature, "")
                if s.exact and why and case.expect == W:
                    text += f" (not compared with DDP: {why})"
                lines.append(f"| {FEATURES[case.feature]} | {text} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m tests.e2e.compat_cases: rewrite docs/compatibility.md
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
    page.write_text(render_markdown(), encoding="utf-8")
