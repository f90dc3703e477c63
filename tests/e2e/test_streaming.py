"""LitData's StreamingDataset on 2 ranks through StreamingView: coverage, exactness, resume."""

import json

import pytest
import torch

from lightning_hetero.sampler import ChunkedPermutation
from tests.e2e.launch import run_script

litdata = pytest.importorskip("litdata")

from tests.e2e.streaming_program import CHANGE_AT, CHANGED, LR, PLAN, WINDOW, initial_layer  # noqa: E402

SAMPLES, CHUNK = 100, 8  # 6 steps of 16 and a last one of 4; 13 chunks
STEPS = 7


def _sample(index: int) -> dict:
    x = torch.randn(4, generator=torch.Generator().manual_seed(index))
    return {"index": index, "x": x, "y": x.sum(0, keepdim=True) * 0.5 + 1.0}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("stream") / "data"
    litdata.optimize(
        fn=_sample, inputs=list(range(SAMPLES)), output_dir=str(out), chunk_size=CHUNK,
        num_workers=1,
    )  # fmt: skip
    return str(out)


def _run(data, tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    run_script("streaming_program.py", data, str(out), str(tmp_path / "ckpt"), *extra, timeout=240)
    return json.loads(out.read_text())


def _expected_batches(seed: int, epochs: int) -> list[list[list[int]]]:
    sizes = [CHUNK] * (SAMPLES // CHUNK) + [SAMPLES % CHUNK]
    order = ChunkedPermutation(sizes, seed=seed, window=WINDOW, group=sum(PLAN))
    batches = []
    for epoch in range(epochs):
        order.set_epoch(epoch)
        positions = order.permutation()
        batches.append([positions[s : s + 16] for s in range(0, SAMPLES, 16)])
    return batches


def _sgd(batches) -> dict[str, torch.Tensor]:
    layer = initial_layer()
    optimizer = torch.optim.SGD(layer.parameters(), lr=LR)
    for epoch in batches:
        for batch in epoch:
            samples = [_sample(i) for i in batch]
            x = torch.stack([s["x"] for s in samples])
            y = torch.stack([s["y"] for s in samples])
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(layer(x), y).backward()
            optimizer.step()
    return {k: v.detach() for k, v in layer.state_dict().items()}


def _by_step(seen) -> dict[tuple[int, int], list[list[int]]]:
    steps: dict[tuple[int, int], list[list[int]]] = {}
    for rank, rows in enumerate(seen):
        for epoch, batch_idx, *samples in rows:
            steps.setdefault((epoch, batch_idx), [[], []])[rank] = samples
    return steps


def _assert_weights(got, expected):
    for name, value in expected.items():
        torch.testing.assert_close(torch.tensor(got[name]), value, atol=1e-5, rtol=0)


def test_streaming_view_trains_exactly_and_resumes_inside_an_epoch(data, tmp_path):
    whole = _run(data, tmp_path, "whole")
    assert whole["group"] == sum(PLAN)
    expected = _expected_batches(whole["seed"], 2)
    steps = _by_step(whole["seen"])
    assert sorted(steps) == [(e, s) for e in range(2) for s in range(STEPS)]
    for (epoch, step), (rank0, rank1) in steps.items():
        # each rank reads exactly its share of the global batch the order makes, in order
        assert rank0 + rank1 == expected[epoch][step]
        if step < STEPS - 1:
            changed = epoch == 1 or step >= CHANGE_AT
            assert [len(rank0), len(rank1)] == (CHANGED if changed else PLAN)
    for epoch in range(2):  # every sample once per epoch
        used = [i for (e, _), ranks in steps.items() if e == epoch for r in ranks for i in r]
        assert sorted(used) == list(range(SAMPLES))
    # the weighted gradients equal single-process SGD on the same global batches
    _assert_weights(whole["weights"], _sgd(expected))

    # resume from the checkpoint written after step 4 of epoch 0 (the change is scheduled)
    (checkpoint,) = (tmp_path / "ckpt").glob("*step=4.ckpt")
    resumed = _run(data, tmp_path, "resumed", "--resume", str(checkpoint))
    again = _by_step(resumed["seen"])
    assert sorted(again) == [(0, s) for s in range(4, STEPS)] + [(1, s) for s in range(STEPS)]
    assert all(again[key] == steps[key] for key in again)
    _assert_weights(resumed["weights"], _sgd(expected))


def test_a_dataset_built_in_train_dataloader_sees_each_ranks_variables(tmp_path):
    """MosaicML's StreamingDataset reads RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE
    when built; Lightning's launcher sets neither RANK nor LOCAL_WORLD_SIZE, so the strategy
    does. Its reads by index still cover every sample once per epoch."""
    out = tmp_path / "env.json"
    run_script("rank_env_program.py", str(out), timeout=240)
    rows = json.loads(out.read_text())
    assert [row["env"] for row in rows] == [
        {"RANK": str(k), "WORLD_SIZE": "2", "LOCAL_RANK": str(k), "LOCAL_WORLD_SIZE": "2"}
        for k in range(2)
    ]
    for epoch in range(2):
        samples = [i for row in rows for e, *batch in row["seen"] if e == epoch for i in batch]
        assert sorted(samples) == list(range(40)), epoch
    # teardown leaves the process as it found it: the two the launcher did not set are gone,
    # and the HeteroCallback the strategy added is removed (issue 40, failure 8)
    assert [row["after"] for row in rows] == [{"RANK": None, "LOCAL_WORLD_SIZE": None}] * 2
    assert [row["hetero"] for row in rows] == [[], []]
