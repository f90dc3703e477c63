from lightning_hetero.bench.run import child_env


def test_a_fresh_job_does_not_inherit_the_rank_variables_of_the_job_that_starts_it(monkeypatch):
    # What an in-process DDP fit (or torchrun, or SLURM) leaves in this process's environment.
    for key, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29511",
        "NODE_RANK": "0",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "TORCHELASTIC_RESTART_COUNT": "1",
        "SLURM_NTASKS": "4",
        "PYTHONWARNINGS": "default",
        "KEEP_ME": "yes",
    }.items():
        monkeypatch.setenv(key, value)
    env = child_env()
    for key in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE"):
        assert key not in env
    assert not any(key.startswith(("TORCHELASTIC_", "SLURM_")) for key in env)
    assert env["KEEP_ME"] == "yes"
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["PYTHONWARNINGS"] == "ignore"
    assert "PYTHONWARNINGS" not in child_env(warnings=True)
    assert child_env(MASTER_PORT="1234")["MASTER_PORT"] == "1234"


def test_a_pair_alternates_which_strategy_goes_first_and_only_hetero_gets_its_options(
    monkeypatch, tmp_path
):
    from lightning_hetero.bench import run as run_module

    calls = []
    monkeypatch.setattr(
        run_module, "launch", lambda config, workdir, timeout: calls.append(config) or {}
    )
    for repeat in range(2):
        pair = run_module.run_pair({"epochs": 3}, repeat, tmp_path, {"adjust_every": 2})
        assert set(pair) == {"ddp", "hetero"}
    assert [(c["strategy"], c["seed"]) for c in calls] == [
        ("ddp", 0),
        ("hetero", 0),
        ("hetero", 1),
        ("ddp", 1),
    ]
    assert all(("adjust_every" in c) == (c["strategy"] == "hetero") for c in calls)
    assert all(c["epochs"] == 3 for c in calls)
