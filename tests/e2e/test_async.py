"""Async (parameter server) mode on 3 gloo ranks, launched as a user would."""

import json
import os
import re
import signal
import socket
import subprocess
import sys

import torch

from lightning_hetero.bench.run import child_env
from tests.e2e.async_run import TRUE_B, TRUE_W
from tests.e2e.launch import HERE, run_script


def run(tmp_path, name, expect_failure=False, **config):
    out = tmp_path / f"{name}.json"
    config = {"out": str(out), **config}
    if expect_failure:
        proc = subprocess.run(
            [sys.executable, "async_run.py", json.dumps(config)],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=HERE,
            env=child_env(),
        )
        assert proc.returncode != 0
        return proc.stdout + proc.stderr
    run_script("async_run.py", json.dumps(config), timeout=240)
    return json.loads(out.read_text())


def distance_to_optimum(report) -> float:
    weight = torch.tensor(report["weight"])
    return float((weight - TRUE_W.flatten()).abs().max().item() + abs(report["bias"] - TRUE_B))


def test_async_converges_to_the_least_squares_optimum_like_bsp(tmp_path):
    asynchronous = run(tmp_path, "async", mode="async", epochs=12, lr=0.1)
    synchronous = run(tmp_path, "bsp", mode="bsp", epochs=12, lr=0.1)
    assert distance_to_optimum(synchronous) < 1e-3
    assert distance_to_optimum(asynchronous) < 1e-3
    # every push reached the server, and nothing else did
    assert asynchronous["server_updates"] == asynchronous["pushes"]
    assert sum(asynchronous["pushes"]) == 3 * 12 * (384 // 48)
    last = asynchronous["history"][-1]
    assert last["updates"] == [8.0, 8.0, 8.0] and len(last["staleness"]) == 3


def test_server_state_survives_a_checkpoint_and_resume(tmp_path):
    ckpt = tmp_path / "ckpt"
    saved = tmp_path / "server.pt"
    common = {"mode": "async", "lr": 0.02, "momentum": 0.9, "ckpt_dir": str(ckpt)}
    run(tmp_path, "first", epochs=2, save_server=str(saved), **common)
    report = run(
        tmp_path,
        "resumed",
        epochs=3,
        resume=str(ckpt / "last.ckpt"),
        check_server=str(saved),
        **common,
    )
    assert report["checked"] == {"params_equal": True, "momentum_equal": True}


def test_a_worker_that_dies_is_named_and_a_resume_finishes(tmp_path):
    ckpt = tmp_path / "ckpt"
    common = {"mode": "async", "lr": 0.05, "ckpt_dir": str(ckpt), "rpc_timeout": 30}
    failure = run(
        tmp_path, "killed", expect_failure=True, epochs=3, kill_rank=2, kill_step=12, **common
    )
    # Every rank reports what it sees; rank 1 may also find rank 0 gone once rank 0 has
    # shut down after its own report. Rank 0, the server's host, is the one to read.
    named = re.search(r"rank 0 finds that rank\(s\) \[([0-9, ]+)\] no longer answer", failure)
    assert named, failure[-3000:]
    ranks = [int(rank) for rank in named.group(1).split(",")]
    assert 2 in ranks and 0 not in ranks
    report = run(tmp_path, "resumed", epochs=3, resume=str(ckpt / "last.ckpt"), **common)
    assert len(report["history"]) == 3  # epoch 0 from the checkpoint, then epochs 1 and 2
    assert all(torch.isfinite(torch.tensor(report["weight"])))


def test_a_busy_rpc_port_on_one_host_neither_hangs_nor_fails_the_run(tmp_path):
    # MASTER_PORT + 1 held on the main node: rank 0 used to fail to listen there while rank 1
    # waited out torch's 30-minute rendezvous for it (and held the job's output open); now
    # rank 0 checks the port and, every rank being on this host, takes a free one
    from lightning_hetero.paramserver import free_port

    out = tmp_path / "busy.json"
    config = {"out": str(out), "mode": "async", "epochs": 1, "occupy_rpc_port": True}
    for _ in range(5):  # a main port whose next one is free to hold
        main_port = free_port("127.0.0.1")
        with socket.socket() as probe:
            try:
                probe.bind(("", main_port + 1))
                break
            except OSError:
                continue
    proc = subprocess.Popen(
        [sys.executable, "async_run.py", json.dumps(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=HERE,
        env=child_env(MASTER_PORT=str(main_port)),
        start_new_session=True,
    )
    try:
        log, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        raise AssertionError(f"the run hung with its RPC port busy:\n{log[-3000:]}") from None
    assert proc.returncode == 0, log[-3000:]
    assert sum(json.loads(out.read_text())["pushes"]) == 3 * (384 // 48)
