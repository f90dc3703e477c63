"""Every use of Lightning's private attributes, in one place.

Each helper says which Lightning behaviour it relies on (checked against the versions in
``SUPPORTED``); ``PRIVATE_ATTRIBUTES`` lists what they touch, and a test fails loudly
when a Lightning release drops one of them. The one copy of a Lightning method's sequence,
``model_parallel_setup``, is compared with Lightning's source by a test too. A Lightning
upgrade touches this file only.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from lightning.fabric.utilities.init import _materialize_distributed_module
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_hetero._comm import shadow, time_calls

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.strategies import ModelParallelStrategy

__all__ = [
    "PRIVATE_ATTRIBUTES",
    "PRIVATE_FUNCTIONS",
    "SUBCLASS_ATTRIBUTES",
    "SUPPORTED",
    "at_last_batch",
    "check_own_sigterm_only",
    "chosen_by_trainer",
    "count_loader_batches",
    "in_training_batch",
    "log_resets_once",
    "logging_step",
    "logs_step_metrics",
    "model_parallel_setup",
    "name_unused_parameters_fix",
    "request_train_reload",
    "running_hook",
    "sampler_epoch",
    "skips_backward",
    "time_sigterm_broadcast",
    "put_back_training_loader",
    "set_logged_batch",
    "step_checkpoints",
    "set_loop_counts",
    "set_validation_steps",
    "settle_logged_metrics",
    "stash_loader_states",
    "unstash_loader_states",
]

#: The Lightning versions these helpers were checked against (``>=`` floor, ``<`` ceiling).
SUPPORTED = (">=2.4", "<2.7")
#: ``(where, attribute)`` for each private attribute used here; ``where`` is a dotted path
#: from a ``Trainer`` (``""``: the Trainer itself).
PRIVATE_ATTRIBUTES = (
    ("fit_loop", "_combined_loader"),
    ("", "_logger_connector"),
    ("_logger_connector", "should_update_logs"),
    ("fit_loop", "_should_accumulate"),
    ("_logger_connector", "_first_loop_iter"),
    ("fit_loop.epoch_loop", "_broadcast_sigterm_tensor"),
    ("fit_loop.epoch_loop", "_batches_that_stepped"),
    ("", "_results"),
    ("lightning_module", "_current_fx_name"),
    ("fit_loop.epoch_loop", "_should_check_val_fx"),
    ("_logger_connector", "should_reset_tensors"),
    ("fit_loop", "max_batches"),
    ("checkpoint_callback", "_every_n_train_steps"),
    ("checkpoint_callback", "_train_time_interval"),
    ("fit_loop", "_skip_backward"),
)
#: Private functions of Lightning used here (``module``, ``name``).
PRIVATE_FUNCTIONS = (
    ("lightning.fabric.utilities.init", "_materialize_distributed_module"),
    ("lightning.fabric.utilities.optimizer", "_optimizers_to_device"),
)
#: The second and last place: the strategies subclass Lightning's and override or read these
#: protected members (their subclassing surface, not a loop's internals): ``(class, name)``.
SUBCLASS_ATTRIBUTES = (
    ("DDPStrategy", "_setup_model"),
    ("DDPStrategy", "_register_ddp_hooks"),
    ("DDPStrategy", "_layer_sync"),
    ("DDPStrategy", "_timeout"),
    ("ModelParallelStrategy", "_data_parallel_size"),
    ("ModelParallelStrategy", "_timeout"),
    ("ModelParallelStrategy", "_layer_sync"),
)


def settle_logged_metrics(trainer: "pl.Trainer") -> None:
    """Run Lightning's pending epoch-level metric syncs now, on this rank.

    Lightning reduces values logged with ``sync_dist=True`` and torchmetrics objects lazily,
    with a collective, the first time anyone reads them after the epoch's last batch: on rank
    0 that is the progress bar (or any ``@rank_zero_only`` callback), on the other ranks the
    logger connector, after every ``on_train_epoch_end`` callback. A collective of ours in
    between would pair with the wrong one and hang. Reading the metrics on every rank before
    our own collectives puts the metric syncs first everywhere, in the same order, whatever
    the callback order; values computed once are cached, so nothing is synced twice.
    """
    _ = trainer.callback_metrics


def logging_step(trainer: "pl.Trainer", epoch_end: bool = False) -> int:
    """The step at which Lightning logs what is logged now: ``self.log`` in a training step,
    or, with ``epoch_end``, in ``on_train_epoch_end`` (the epoch-level values).

    Lightning's loggers count batches that stepped, raised after a batch's
    ``on_train_batch_end`` (``trainer.global_step`` counts optimizer steps and is already
    raised there, one ahead). Epoch-level values are logged after the epoch's last batch
    raised that count: ``_FitLoop.on_advance_end`` lowers it by one around
    ``update_train_epoch_metrics``, after every ``on_train_epoch_end`` hook, so that they share
    the step of the epoch's last batch (and of a validation run after it).
    """
    stepped = int(trainer.fit_loop.epoch_loop._batches_that_stepped)
    return stepped - 1 if epoch_end else stepped


def logs_step_metrics(trainer: "pl.Trainer") -> bool:
    """Whether Lightning logs the step-level values of the training batch now ending.

    The test of ``_LoggerConnector.update_train_step_metrics``, run after the batch's
    ``on_train_batch_end``: every ``log_every_n_steps`` batches that stepped (counted from 1),
    every batch under ``fast_dev_run``, and never on a batch that only accumulates gradients.
    """
    if trainer.fit_loop._should_accumulate() and trainer.lightning_module.automatic_optimization:
        return False
    return bool(trainer._logger_connector.should_update_logs or trainer.fast_dev_run)


def chosen_by_trainer(environment: ClusterEnvironment) -> bool:
    """Whether the Trainer could have picked ``environment`` itself, for a strategy without one
    and no environment in ``plugins``: the first of TorchElastic, SLURM, LSF and MPI whose
    ``detect()`` finds it, else a ``LightningEnvironment``
    (``_AcceleratorConnector._choose_and_init_cluster_environment``)."""
    automatic = (
        TorchElasticEnvironment,
        SLURMEnvironment,
        LSFEnvironment,
        MPIEnvironment,
        LightningEnvironment,
    )
    return type(environment) in automatic and type(environment).detect()


def name_unused_parameters_fix(exception: BaseException, strategy: str) -> None:
    """Make the advice on DDP's unused-parameters error name ``strategy``'s own option.

    ``DDPStrategy.on_exception`` replaces DDP's "Expected to have finished reduction in the
    prior iteration" error with advice to use ``strategy='ddp_find_unused_parameters_true'``,
    which would drop the user's strategy for plain DDP.
    """
    exception.args = tuple(
        f"{arg.split(' either by setting')[0].rstrip(',')}: pass"
        f" `strategy={strategy}(find_unused_parameters=True)` (hetero: the string"
        " `strategy='ddp_find_unused_parameters_true'` would train with plain DDP instead)."
        if isinstance(arg, str) and "ddp_find_unused_parameters_true" in arg
        else arg
        for arg in exception.args
    )


def at_last_batch(trainer: "pl.Trainer") -> bool:
    """Whether the training epoch's last batch has run (a validation now is the epoch's end
    one, before ``on_train_epoch_end``)."""
    return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def sampler_epoch(trainer: "pl.Trainer") -> int:
    """The epoch Lightning gives the training samplers (``set_epoch``) at the next epoch
    start: the epochs processed, which after a resume at an epoch's end is one more than
    ``trainer.current_epoch`` until that epoch starts."""
    return int(trainer.fit_loop.epoch_progress.current.processed)


def request_train_reload(trainer: "pl.Trainer") -> None:
    """Make Lightning build the training loader again before the next epoch starts.

    Lightning rebuilds it at an epoch start when it has none (``fit_loop.setup_data``);
    call this at or before the previous epoch's end, or before the first one.
    """
    trainer.fit_loop._combined_loader = None


def in_training_batch(module: "pl.LightningModule | None") -> bool:
    """Whether a reduction now is of a training batch's step-level logged value (``False``
    for a module attached to no Trainer).

    Lightning reduces a ``sync_dist`` value logged on step at once, when it is logged
    (``_ResultMetric.update``), and an epoch-level one (a sum and a sample count, each
    reduced) only when it is first read after the epoch's last batch. The logger connector's
    ``_first_loop_iter`` is set at the first batch's start (``on_batch_start``) and back to
    ``None`` once the batches are over (``epoch_end_reached``); validation within the epoch
    runs with ``trainer.training`` false.
    """
    if module is None:
        return False
    try:
        trainer = module.trainer
    except RuntimeError:  # a module attached to no Trainer
        return False
    connector = getattr(trainer, "_logger_connector", None)
    return trainer.training and getattr(connector, "_first_loop_iter", None) is not None


def check_own_sigterm_only(trainer: "pl.Trainer") -> Callable[[], None]:
    """Stop Lightning from broadcasting rank 0's SIGTERM flag before every training step, and
    return what puts the broadcast back.

    Lightning 2.5.6 and later run that broadcast
    (``_TrainingEpochLoop._broadcast_sigterm_tensor``), a collective that ties every rank to
    rank 0's pace and deadlocks ranks that make different numbers of steps. Each rank checks
    its own flag instead.
    """
    loop = trainer.fit_loop.epoch_loop
    if not hasattr(loop, "_broadcast_sigterm_tensor"):
        return lambda: None  # earlier releases (2.5.0 among them) have no such broadcast

    def check_own_sigterm() -> None:
        if getattr(trainer, "received_sigterm", False):
            raise SIGTERMException()

    return shadow(loop, "_broadcast_sigterm_tensor", check_own_sigterm)


def time_sigterm_broadcast(trainer: "pl.Trainer", waiting: Callable[[], Any]) -> Callable[[], None]:
    """Run Lightning's broadcast of rank 0's SIGTERM flag before every training batch
    (``_TrainingEpochLoop._broadcast_sigterm_tensor``) inside ``waiting()``, a timer's
    context for a collective, and return what puts it back.

    Under gradient accumulation a DDP rank meets its slower peers there, at every loader
    batch, and not only in the optimizer step's all-reduce: that wait is no compute.
    """
    loop = trainer.fit_loop.epoch_loop
    if not hasattr(loop, "_broadcast_sigterm_tensor"):
        return lambda: None  # earlier releases have no such broadcast
    return time_calls(loop, ("_broadcast_sigterm_tensor",), waiting)


def model_parallel_setup(
    strategy: "ModelParallelStrategy",
    trainer: "pl.Trainer",
    parallelize: Callable[["torch.nn.Module"], "torch.nn.Module"],
) -> None:
    """``ModelParallelStrategy.setup``, with ``parallelize(model)`` where it demands a
    ``configure_model`` (and refuses FSDP1 modules): sharding a model whose LightningModule
    has none is what ``HeteroFSDPStrategy`` adds, and ``parallelize`` makes the refusals.

    The rest is Lightning's sequence, step for step: materialize what was built on the meta
    device, convert to the precision, move to the device, build the optimizers and move their
    state. ``tests/test_architecture.py`` compares it with Lightning's source.
    """
    assert strategy.model is not None
    assert strategy.accelerator is not None
    strategy.accelerator.setup(trainer)
    strategy.model = parallelize(strategy.model)
    _materialize_distributed_module(strategy.model, strategy.root_device)
    strategy.model = strategy.precision_plugin.convert_module(strategy.model)
    strategy.model_to_device()  # what the sharding left on the CPU
    strategy.barrier()
    if trainer.state.fn == TrainerFn.FITTING:
        strategy.setup_optimizers(trainer)
    strategy.setup_precision_plugin()
    if trainer.state.fn == TrainerFn.FITTING:
        _optimizers_to_device(strategy.optimizers, strategy.root_device)


#: The Trainer's counts of loader batches that ``set_loop_counts`` may set.
LOOP_COUNTS = ("accumulate_grad_batches", "val_check_interval", "limit_train_batches")


def set_loop_counts(
    trainer: "pl.Trainer", counts: dict[str, int | float]
) -> dict[str, int | float]:
    """Set the Trainer's ``accumulate_grad_batches``, ``val_check_interval`` or
    ``limit_train_batches`` for the run about to start; returns their previous values.

    Public attributes that Lightning reads again in every fit, after the strategy's
    ``setup_environment``: ``accumulate_grad_batches`` in each batch (the automatic loop's
    loss normalization, ``_should_accumulate``) and in ``estimated_stepping_batches``; the
    other two when the training loader is set up (``_FitLoop.setup_data``). Set them before
    Lightning's ``setup`` (``configure_optimizers`` may read the estimate there) and put them
    back at teardown, so that a later ``fit`` of the same Trainer starts from the user's.
    """
    previous = {}
    for name, value in counts.items():
        assert name in LOOP_COUNTS, name
        previous[name] = getattr(trainer, name)
        setattr(trainer, name, value)
    return previous


#: A ``val_check_batch`` no loop batch index reaches.
_NEVER = 2**62


def set_validation_steps(
    trainer: "pl.Trainer", validates: "Callable[[int], bool | None]"
) -> "Callable[[], None]":
    """Make the training loop validate after loop batch ``batch_idx`` (of the epoch) where
    ``validates(batch_idx)`` says so (``None``: Lightning's own rule); returns the undo.

    The epoch loop decides after each batch with ``_should_check_val_fx``: not in an epoch
    that ``check_val_every_n_epoch`` skips, always where ``trainer.should_stop`` asks for it
    (early stopping) or a time-based interval has passed, else every ``val_check_batch``
    batches. The batch rule is set for the call (``val_check_batch`` 1 or never), the others
    stay Lightning's.
    """
    loop = trainer.fit_loop.epoch_loop
    original = type(loop)._should_check_val_fx.__get__(loop)

    def should_check_val(data_fetcher: object) -> bool:
        kept = trainer.val_check_batch
        decided = validates(loop.batch_idx)
        if decided is None or kept is None or kept == float("inf"):
            return original(data_fetcher)
        trainer.val_check_batch = 1 if decided else _NEVER
        try:
            return original(data_fetcher)
        finally:
            trainer.val_check_batch = kept

    return shadow(loop, "_should_check_val_fx", should_check_val)


def around_loop_backward(
    trainer: "pl.Trainer",
    backward: "Callable[[Callable[[torch.Tensor], None], torch.Tensor, Any], None]",
) -> "Callable[[], None]":
    """Run each backward of the automatic optimization's closures (``run(loss)``: the
    strategy's ``backward``, Lightning's ``on_before_backward`` and ``on_after_backward``
    hooks inside it) as ``backward(run, loss, optimizer)``; returns the undo.

    The loop builds each step's backward with ``_make_backward_fn(optimizer)`` (``None``
    where it skips the backward: SWA's batch-norm epoch); whoever runs the closure (the
    optimizer step, or a user's ``optimizer_step`` that calls it without stepping) runs it.
    """
    loop = trainer.fit_loop.epoch_loop.automatic_optimization
    make = type(loop)._make_backward_fn.__get__(loop)

    def make_backward_fn(optimizer: Any) -> "Callable[[torch.Tensor], None] | None":
        run = make(optimizer)
        if run is None:
            return None
        return lambda loss: backward(run, loss, optimizer)

    return shadow(loop, "_make_backward_fn", make_backward_fn)


def around_precision_backward(
    strategy: "pl.strategies.Strategy",
    backward: "Callable[[torch.Tensor, Callable[[torch.Tensor], None]], None]",
) -> "Callable[[], None]":
    """Run ``strategy``'s precision plugin's ``backward`` of ``tensor`` as ``backward(tensor,
    run)``, where ``run(loss)`` is the plugin's own backward of ``loss``; returns the undo.

    The plugin's ``backward`` is the backpropagation of one ``Strategy.backward`` call, after
    the ``on_before_backward`` hooks and the plugin's loss scaling, before the
    ``on_after_backward`` hooks. Shadowing it (an instance attribute) instead of overriding
    ``Strategy.backward`` leaves the strategy's ``backward`` Lightning's own, as programs and
    Lightning's own tests expect of a ``DDPStrategy`` (they wrap or count it).
    """
    plugin = strategy.precision_plugin
    original = plugin.backward

    def wrapped(tensor: Any, module: Any, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        backward(tensor, lambda loss: original(loss, module, optimizer, *args, **kwargs))

    return shadow(plugin, "backward", wrapped)


def count_loader_batches(
    trainer: "pl.Trainer", batches: "Callable[[], int]", per_step: int
) -> "Callable[[], None]":
    """Make the Trainer's progress bar count an epoch's ``batches()`` loader batches, ``per_step``
    of them per loop batch (``0``: Lightning's own count); returns the undo.

    Lightning's bars read their total from ``trainer.num_training_batches`` (the fit loop's
    ``max_batches``, through ``ProgressBar.total_train_batches``) in ``on_train_epoch_start``
    (and Rich's, when resumed, in ``on_train_batch_end``) and their position from
    ``batch_idx + 1`` in ``on_train_batch_end``. Around those two hooks of the bar only, the
    total is the loader batches and the position the last loader batch of the loop batch's
    window, as under Lightning's own accumulation; the loop, the other callbacks and the
    validation schedule keep the loop's counts.
    """
    bar = trainer.progress_bar_callback
    if bar is None:
        return lambda: None
    loop = trainer.fit_loop
    start, end = bar.on_train_epoch_start, bar.on_train_batch_end

    @contextmanager
    def counted() -> Iterator[int]:
        kept, count = loop.max_batches, batches()
        if count:
            loop.max_batches = count
        try:
            yield count
        finally:
            loop.max_batches = kept

    def on_train_epoch_start(*args: Any, **kwargs: Any) -> None:
        with counted():
            start(*args, **kwargs)

    def on_train_batch_end(*args: Any) -> None:
        *other, batch_idx = args
        with counted() as count:
            if count:
                batch_idx = min((batch_idx + 1) * per_step, count) - 1
            end(*other, batch_idx)

    undo_start = shadow(bar, "on_train_epoch_start", on_train_epoch_start)
    undo_end = shadow(bar, "on_train_batch_end", on_train_batch_end)

    def undo() -> None:
        undo_start()
        undo_end()

    return undo


def log_resets_once(trainer: "pl.Trainer") -> "Callable[[], None]":
    """Until the returned undo is called, reset each hook's logged tensors at most once.

    In an epoch's first loop batch, ``self.log`` resets the epoch's logged tensors of the
    hook it runs in whenever that hook differs from the one logged under last
    (``_LoggerConnector.should_reset_tensors``): a step's micro-batches alternate
    ``training_step`` and the backward hooks inside one loop batch, which would drop the
    earlier micro-batches' epoch-level values. Each hook is reset at its first log of the
    batch, as in one batch of DDP's accumulation.
    """
    connector = trainer._logger_connector
    original = type(connector).should_reset_tensors.__get__(connector)
    seen: set[str] = set()

    def should_reset_tensors(fx: str) -> bool:
        if fx in seen:
            return False
        seen.add(fx)
        return original(fx)

    return shadow(connector, "should_reset_tensors", should_reset_tensors)


def set_logged_batch(trainer: "pl.Trainer", batch: object) -> None:
    """Make ``self.log`` infer its batch size from ``batch`` from now on in this step.

    Lightning keeps the step's batch on its result collection (``trainer._results.batch``,
    set by the logger connector's ``on_batch_start``) and caches the size it extracts from it
    (``batch_size``); a micro-batch's logged values weigh its own samples, as they would were
    each micro-batch a Lightning batch of gradient accumulation.
    """
    results = trainer._results
    if results is not None:
        results.batch = batch
        results.batch_size = None


def skips_backward(trainer: "pl.Trainer") -> bool:
    """Whether Lightning's loop runs training steps without their backward now (the
    ``StochasticWeightAveraging`` callback's batch-norm epoch)."""
    return bool(trainer.fit_loop._skip_backward)


@contextmanager
def running_hook(module: "pl.LightningModule", name: str) -> Iterator[None]:
    """Run code as Lightning's hook ``name``, as its ``_call_strategy_hook`` does.

    ``self.log`` files what is logged under the hook running now (the module's
    ``_current_fx_name``); a micro-batch's ``training_step`` called by the strategy, rather
    than by the loop, logs into the same results as the step's first micro-batch.
    """
    previous = module._current_fx_name
    module._current_fx_name = name
    try:
        yield
    finally:
        module._current_fx_name = previous


#: Where a checkpoint of the hetero strategies keeps the training loader's position in the
#: epoch: a key of its own, which Lightning's loops under any other strategy ignore.
LOADER_STATES_KEY = "lightning_hetero/train_loader"


def _loop_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    state = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict")
    return state if isinstance(state, dict) else None


def stash_loader_states(checkpoint: dict[str, Any]) -> None:
    """Move the training loader's state out of the fit loop's (``combined_loader``, which
    Lightning writes for a loader with a ``state_dict``) to ``LOADER_STATES_KEY``.

    Lightning refuses to resume a checkpoint whose fit loop holds more loader states than
    the run has stateful loaders ("The CombinedLoader has 0 stateful loaders, but found 1
    states in the checkpoint"): under ``"ddp"``, ``"auto"`` or one device, the plain
    loader has none. Kept apart, the state is ignored there and put back under the hetero
    strategies (``unstash_loader_states``)."""
    loop = _loop_state(checkpoint)
    if loop is not None and "combined_loader" in loop:
        checkpoint[LOADER_STATES_KEY] = loop.pop("combined_loader")


def unstash_loader_states(checkpoint: dict[str, Any]) -> None:
    """Put what ``stash_loader_states`` moved back where Lightning's fit loop reads it (before
    the loops are restored: from ``Callback.on_load_checkpoint``)."""
    states = checkpoint.pop(LOADER_STATES_KEY, None)
    loop = _loop_state(checkpoint)
    if states is not None and loop is not None:
        loop["combined_loader"] = states


def put_back_training_loader(trainer: "pl.Trainer", ours: object, theirs: object) -> None:
    """After a fit, hand the fit loop the training loader Lightning gave the strategy
    (``theirs``) where it holds the strategy's own (``ours``), as under DDP.

    ``trainer.train_dataloader`` is then the user's loader again, and the loop's live state
    holds no loader position, like the checkpoints the strategy writes
    (``stash_loader_states``). A later fit loads its data anew (Lightning clears the loader
    whenever it attaches data)."""
    combined = trainer.fit_loop._combined_loader
    if combined is None:
        return
    loaders = combined.flattened
    if any(loader is ours for loader in loaders):
        combined.flattened = [theirs if loader is ours else loader for loader in loaders]


def step_checkpoints(trainer: "pl.Trainer") -> list[str]:
    """The ``ModelCheckpoint`` callbacks of ``trainer`` that save on training steps or on
    time (``every_n_train_steps``, ``train_time_interval``), each as the option it was
    given: they act on a step count, or agree across ranks at every step."""
    found = []
    for callback in getattr(trainer, "callbacks", ()):
        if not isinstance(callback, ModelCheckpoint):
            continue
        if callback._every_n_train_steps:
            found.append(f"ModelCheckpoint(every_n_train_steps={callback._every_n_train_steps})")
        if callback._train_time_interval is not None:
            found.append(f"ModelCheckpoint(train_time_interval={callback._train_time_interval})")
    return found
