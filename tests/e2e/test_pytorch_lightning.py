"""Programs written against ``pytorch_lightning`` (``import pytorch_lightning as pl``), and
LightningCLI programs from both copies of Lightning, choosing HeteroStrategy every way users do.

``pytorch_lightning`` is a separate copy of Lightning with its own classes and strategy
registry: ``pl.Trainer(strategy="hetero")`` builds ``lightning_hetero.pytorch_lightning``'s
strategy, and an object of ``lightning_hetero`` (built on ``lightning.pytorch``) is refused with
the import to use.
"""

import json

import pytest

from tests.e2e.launch import run_script

TWIN = "lightning_hetero.pytorch_lightning"


@pytest.mark.parametrize(
    ("form", "callbacks"),
    [
        pytest.param("name", "none", id="strategy-name"),
        pytest.param("twin", "twin", id="lightning_hetero.pytorch_lightning-object-and-callbacks"),
    ],
)
def test_pytorch_lightning_program_trains(tmp_path, form: str, callbacks: str) -> None:
    out = tmp_path / "result.json"
    run_script("pl_program.py", str(out), "--form", form, "--callbacks", callbacks, timeout=240)
    result = json.loads(out.read_text())

    assert result["strategy"] == f"{TWIN}.strategy.HeteroStrategy"
    assert result["same_object"] is (form != "name")  # the user's object, not a copy
    # 64 samples, global batch 2 x 8 = 16: 4 steps per epoch, 2 epochs
    assert result["global_step"] == 8
    assert [entry["epoch"] for entry in result["history"]] == [0, 1]
    assert all(sum(entry["batch_sizes"]) == 16 for entry in result["history"])
    assert {"train_loss_epoch", "val_loss"} <= set(result["metrics"])
    assert {"hetero/balance", "hetero/batch_size/rank1", "train_loss_epoch"} <= set(
        result["logged"]
    )
    assert result["foreign_callbacks"] == []
    assert result["given_callbacks_used"]
    expected = []  # the HeteroCallback the strategy adds is removed after fit
    if callbacks != "none":
        expected = [f"{TWIN}.callback.HeteroCallback", f"{TWIN}.emulate.Throttle"]
        # the Throttle makes rank 1 slow: the plan moves samples to rank 0
        first = result["history"][0]
        assert first["next_batch_sizes"][0] > first["next_batch_sizes"][1]
    assert result["callbacks"] == expected


@pytest.mark.parametrize(
    ("form", "callbacks", "raised_by", "needed"),
    [
        # the import users write first: built on lightning.pytorch, refused by pl.Trainer
        pytest.param("object", "twin", "Trainer", "HeteroStrategy", id="lightning_hetero-object"),
        # HeteroCallback and Throttle from lightning_hetero: refused when the run starts
        pytest.param("twin", "lightning", "fit", "HeteroCallback", id="lightning_hetero-callbacks"),
    ],
)
def test_pytorch_lightning_program_is_told_the_import_to_use(
    tmp_path, form: str, callbacks: str, raised_by: str, needed: str
) -> None:
    out = tmp_path / "result.json"
    run_script("pl_program.py", str(out), "--form", form, "--callbacks", callbacks, timeout=240)
    result = json.loads(out.read_text())

    assert result["raised_by"] == raised_by
    assert f"pytorch_lightning's Trainer needs `{TWIN}.{needed}`" in result["error"]
    assert result["kept_types"]  # nothing rebuilt as the other copy's class


@pytest.mark.parametrize("copy", ["lightning", "pytorch_lightning"])
def test_lightning_cli_strategy_forms(tmp_path, copy: str) -> None:
    out = tmp_path / "forms.json"
    run_script("cli_program.py", copy, str(out), timeout=240)
    results = json.loads(out.read_text())
    expected = (
        f"{TWIN}.strategy.HeteroStrategy"
        if copy == "pytorch_lightning"
        else "lightning_hetero.strategy.HeteroStrategy"
    )
    # A bare value before anything imported lightning_hetero: jsonargparse keeps it as a
    # string without importing it, so Lightning rejects it and no code of ours can run (the
    # README documents the forms below). Kept as a check that this is still Lightning's.
    assert "invalid strategy name" in results["bare_not_imported"]["error"]
    # a class path jsonargparse builds is the object of that class: one of the other copy is
    # refused by the Trainer, with the import to use
    other_copy = (
        {"class_path", "yaml", "bare_with_arguments"}
        if copy == "pytorch_lightning"
        else {"twin_class_path"}
    )
    needed = (
        f"{TWIN}.HeteroStrategy"
        if copy == "pytorch_lightning"
        else "lightning_hetero.HeteroStrategy"
    )
    for form, adjust_every in [
        ("class_path", 3),
        ("yaml", 5),
        ("bare_with_arguments", 4),
        ("twin_class_path", "epoch"),  # lightning_hetero.pytorch_lightning.HeteroStrategy
        ("bare", "epoch"),  # once the package is imported: registered as an alias, either copy
        ("name", "epoch"),
    ]:
        if form in other_copy:
            assert f"Trainer needs `{needed}`" in results[form].get("error", ""), results[form]
            continue
        assert results[form].get("strategy") == expected, (form, results[form])
        assert results[form]["adjust_every"] == adjust_every, form
    package = TWIN if copy == "pytorch_lightning" else "lightning_hetero"
    assert results["callback"]["strategy"] == expected
    assert results["callback"]["callbacks"] == [f"{package}.emulate.Throttle"]
