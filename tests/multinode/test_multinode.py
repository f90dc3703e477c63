"""4 ranks on 2 emulated hosts (network namespaces) under torchrun, against one host.

Opt-in: ``pytest -m multinode`` (``make test-multinode``); needs root for ``ip netns``.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_hetero.bench.run import child_env
from lightning_hetero.paramserver import free_port
from tests.multinode import netns
from tests.multinode.train import EPOCHS, PER_RANK_BATCH, SAMPLES, SPEEDS

pytestmark = pytest.mark.multinode

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
TIMEOUT = 240


@pytest.fixture(scope="module", autouse=True)
def _needs_namespaces():
    reason = netns.namespaces_unavailable()
    if reason:
        pytest.skip(f"multi-node test skipped: {reason}")


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return child_env(PYTHONPATH=path, **extra)


def _torchrun(nodes: int, per_node: int, endpoint: str, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        "--rdzv-id=lightning-hetero-multinode",
        str(HERE / "train.py"),
        str(out),
        str(nodes),
        str(per_node),
    ]


def _wait(procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + TIMEOUT
    try:
        for proc in procs:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        raise
    finally:
        logs = [proc.stdout.read() if proc.stdout else "" for proc in procs]
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{log[-6000:]}"


def _records(out: Path, world_size: int) -> list[dict]:
    return [json.loads((out / f"rank{k}.json").read_text()) for k in range(world_size)]


def _single_host(tmp_path: Path) -> list[dict]:
    out = tmp_path / "single"
    out.mkdir()
    endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"
    proc = subprocess.Popen(
        _torchrun(1, 4, endpoint, out),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    _wait([proc])
    return _records(out, 4)


def _two_hosts(tmp_path: Path) -> list[dict]:
    out = tmp_path / "multi"
    out.mkdir()
    with netns.hosts(2) as hosts:
        endpoint = f"{hosts[0].address}:29411"
        procs = [
            subprocess.Popen(
                netns.command_on(host, _torchrun(2, 2, endpoint, out)),
                env=_env(GLOO_SOCKET_IFNAME=host.interface),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=ROOT,
            )
            for host in hosts
        ]
        _wait(procs)
        names = {host.namespace for host in hosts}
    assert not names & set(netns.namespaces())  # no namespace left behind
    return _records(out, 4)


def _plans_by_epoch(history: list[dict]) -> list[list[int]]:
    """The plan each epoch trained with: uniform first, then each boundary's decision."""
    uniform = [PER_RANK_BATCH] * 4
    return [uniform] + [entry["next_batch_sizes"] for entry in history[:-1]]


def test_two_hosts_converge_like_one_and_global_ranks_index_the_plan(tmp_path):
    started = time.monotonic()
    multi = _two_hosts(tmp_path)
    multi_s = time.monotonic() - started
    single = _single_host(tmp_path)
    print(f"two hosts: {multi_s:.0f} s; one host: {time.monotonic() - started - multi_s:.0f} s")

    # 4 ranks on 2 hosts: each host ran local ranks 0 and 1, and the global ranks are 0..3
    assert [r["global_rank"] for r in multi] == [0, 1, 2, 3]
    by_host: dict[str, list[int]] = {}
    for record in multi:
        by_host.setdefault(record["host"], []).append(record["local_rank"])
    assert sorted(by_host) == ["hetero-node0", "hetero-node1"]
    assert all(sorted(local) == [0, 1] for local in by_host.values())

    total = PER_RANK_BATCH * 4
    ideal = [total * s / sum(SPEEDS) for s in SPEEDS]
    for records in (multi, single):
        final = records[0]["batch_sizes"]
        assert sum(final) == total
        assert all(abs(b - x) <= 0.2 * x for b, x in zip(final, ideal)), (final, ideal)
    # the same convergence as on one host
    assert all(
        abs(a - b) <= 0.1 * x
        for a, b, x in zip(multi[0]["batch_sizes"], single[0]["batch_sizes"], ideal)
    )

    plans = _plans_by_epoch(multi[0]["history"])
    for epoch in range(EPOCHS):
        key = str(epoch)
        # every sample exactly once per epoch, over ranks on both hosts
        drawn = sorted(i for record in multi for i in record["drawn"][key])
        assert drawn == list(range(SAMPLES))
        # each rank trained with the plan's entry at its global rank (not its local rank)
        for record in multi:
            full_steps = record["sizes"][key][: SAMPLES // total]
            assert set(full_steps) == {plans[epoch][record["global_rank"]]}
    # and the plan tells the hosts' ranks apart: node 1's ranks are not node 0's
    assert plans[-1][:2] != plans[-1][2:]
