import re
import warnings

import pytest

from lightning_hetero.bench.__main__ import main
from lightning_hetero.bench.simulate import parse_spec, predictor_table, simulate_report
from lightning_hetero.planning import ProportionalController


def test_spec_options_reach_the_controller():
    label, factory = parse_spec("proportional:deadband=0.2,learn_max_batch_size=false")
    controller = factory()
    assert isinstance(controller, ProportionalController)
    assert controller.deadband == 0.2 and controller.learn_max_batch_size is False
    assert factory() is not controller  # a fresh controller per run


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope", "Unknown controller 'nope'"),
        ("proportional:deadband", "must be `key=value`"),
        ("proportional:deadband=2", "deadband"),
    ],
)
def test_bad_specs_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_spec(spec)


def test_report_has_one_row_per_scenario_and_controller_with_the_simulated_figures():
    text = simulate_report(["static", "proportional"], ["HL4", "memory"], seeds=[0], progress=False)
    rows = [
        line.split(" | ")
        for line in text.splitlines()
        if line.startswith("| HL4") or line.startswith("| memory")
    ]
    assert [(r[0], r[1]) for r in rows] == [
        ("| HL4", "`static`"),
        ("| HL4", "`proportional`"),
        ("| memory", "`static`"),
        ("| memory", "`proportional`"),
    ]
    static_hl4, proportional_hl4 = rows[0], rows[1]
    assert static_hl4[2:5] == ["0.500", "-", "0"]  # uniform on 9:9:6:24 runs at the slowest's pace
    assert float(proportional_hl4[2]) > 0.95 and proportional_hl4[3] == "1"


def test_command_line_simulate_prints_the_table(capsys):
    main(
        [
            "--simulate",
            "--controllers",
            "static",
            "--scenarios",
            "HL2",
            "--seeds",
            "2",
            "--no-predictors",
        ]
    )
    out = capsys.readouterr().out
    assert "| HL2 | `static` | 0.672 | - | 0 | 0.672 |" in out


def test_command_line_rejects_a_bad_controller_spec(capsys):
    with pytest.raises(SystemExit):
        main(["--simulate", "--controllers", "nope"])
    assert "Unknown controller 'nope'" in capsys.readouterr().err


def test_predictor_table_has_a_row_per_predictor_and_the_oracle():
    text = predictor_table(seeds=[0], boundaries=60)
    names = [line.split(" | ")[0][2:] for line in text.splitlines()[2:6]]
    assert names == ["last", "ema", "narx", "oracle"]


def test_command_line_rejects_a_bad_adjust_every(capsys):
    with pytest.raises(SystemExit):
        main(["--adjust-every", "often"])
    assert "--adjust-every must be 'epoch' or an integer >= 1" in capsys.readouterr().err


_MEMORY = ["--simulate", "--controllers", "proportional", "--scenarios", "memory", "--seeds", "1"]


def test_command_line_simulate_is_quiet_and_counts_the_controllers_warnings(capsys):
    # the memory scenario makes the proportional controller warn (a maximum that binds)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        main([*_MEMORY, "--no-predictors"])
    assert shown == []
    out = capsys.readouterr().out
    assert re.search(r"The controllers warned [1-9]\d* times \(--verbose prints", out)


def test_command_line_simulate_verbose_shows_the_controllers_warnings(capsys):
    with pytest.warns(UserWarning):
        main([*_MEMORY, "--no-predictors", "--verbose"])
    assert "The controllers warned" not in capsys.readouterr().out
