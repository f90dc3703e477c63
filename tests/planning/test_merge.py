"""Tests for lightning_hetero/planning/merge.py: local-SGD merging weights and momentum."""

import math
from collections import Counter

import pytest
import torch

from lightning_hetero.planning.merge import (
    MergeWeights,
    check_local_options,
    check_merge_options,
    claim_order,
    merge_weights,
    momentum_merge,
    outer_step,
    sample_weights,
)

SMALL = [0.01, 0.02, 0.05]  # every replica norm below the default threshold 0.1

# --- merge_weights: basis ---------------------------------------------------------------------


def test_equal_update_counts_weight_by_batch_size() -> None:
    result = merge_weights([16, 32, 80], [5, 5, 5])
    assert result == MergeWeights([0.125, 0.25, 0.625], perturbed=False, basis="batch")


def test_unequal_update_counts_weight_by_updates() -> None:
    result = merge_weights([16, 32, 80], [2, 3, 5])
    assert result.basis == "updates"
    assert not result.perturbed
    assert result.weights == pytest.approx([0.2, 0.3, 0.5])


def test_batch_sizes_are_ignored_when_counts_differ() -> None:
    assert merge_weights([1, 1000], [3, 1]).weights == pytest.approx([0.75, 0.25])


def test_nobody_trained_falls_back_to_batch_weights() -> None:
    result = merge_weights([10, 30], [0, 0])
    assert result.basis == "batch"
    assert result.weights == pytest.approx([0.25, 0.75])


def test_equal_counts_with_zero_batches_use_uniform_update_shares() -> None:
    result = merge_weights([0, 0], [4, 4])
    assert result.basis == "updates"
    assert result.weights == pytest.approx([0.5, 0.5])


def test_single_replica_gets_everything() -> None:
    assert merge_weights([7], [3]).weights == [1.0]


# --- merge_weights: perturbation --------------------------------------------------------------


def test_perturbation_exact_numbers() -> None:
    # alpha = [0.2, 0.3, 0.5]; rank 2 has the most updates, rank 0 the fewest.
    result = merge_weights([16, 32, 80], [2, 3, 5], replica_norms=SMALL, delta=0.1)
    assert result.perturbed
    assert result.basis == "updates"
    assert result.weights == pytest.approx([0.18, 0.3, 0.55])
    # Not renormalized: 1 + delta * (alpha_max - alpha_min).
    assert sum(result.weights) == pytest.approx(1.03)


def test_perturbation_ties_go_to_the_lowest_rank() -> None:
    # Counts 4, 1, 4, 1: most-updated -> rank 0, fewest -> rank 1.
    result = merge_weights([8] * 4, [4, 1, 4, 1], replica_norms=[0.0] * 4, delta=0.5)
    assert result.weights == pytest.approx([0.6, 0.05, 0.4, 0.1])


def test_no_perturbation_when_one_norm_is_above_threshold() -> None:
    result = merge_weights([16, 32, 80], [2, 3, 5], replica_norms=[0.01, 0.1, 0.02])
    assert not result.perturbed
    assert result.weights == pytest.approx([0.2, 0.3, 0.5])


def test_no_perturbation_without_norms() -> None:
    result = merge_weights([16, 32, 80], [2, 3, 5], replica_norms=None)
    assert not result.perturbed
    assert result.weights == pytest.approx([0.2, 0.3, 0.5])


def test_no_perturbation_when_delta_is_zero() -> None:
    result = merge_weights([16, 32, 80], [2, 3, 5], replica_norms=SMALL, delta=0.0)
    assert not result.perturbed
    assert result.weights == pytest.approx([0.2, 0.3, 0.5])


def test_no_perturbation_when_counts_are_equal() -> None:
    result = merge_weights([16, 32, 80], [4, 4, 4], replica_norms=SMALL, delta=0.5)
    assert not result.perturbed
    assert result.weights == pytest.approx([0.125, 0.25, 0.625])


def test_custom_threshold_switches_perturbation() -> None:
    norms = [0.3, 0.4, 0.2]
    assert not merge_weights([1, 1, 1], [1, 2, 3], norms).perturbed
    assert merge_weights([1, 1, 1], [1, 2, 3], norms, threshold=0.5).perturbed


# --- merge_weights: validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_sizes": [], "updates": []}, "at least one replica"),
        ({"batch_sizes": [1, 2], "updates": [1]}, "2 batch sizes but 1 update counts"),
        ({"batch_sizes": [1, -2], "updates": [1, 1]}, "Rank 1: negative batch size -2"),
        ({"batch_sizes": [1, 2], "updates": [-1, 1]}, "Rank 0: negative update count -1"),
        ({"batch_sizes": [0, 0], "updates": [0, 0]}, "all update counts are zero"),
        ({"batch_sizes": [1, 2], "updates": [1, 2], "delta": -0.1}, "negative delta"),
        ({"batch_sizes": [1, 2], "updates": [1, 2], "delta": 1.0}, r"delta must be in \[0, 1\)"),
        ({"batch_sizes": [1, 2], "updates": [1, 2], "delta": math.nan}, "must be finite"),
        ({"batch_sizes": [1, 2], "updates": [1, 2], "threshold": 0.0}, "threshold must be > 0"),
        ({"batch_sizes": [1, 2], "updates": [1, 2], "threshold": -1}, "threshold must be > 0"),
        (
            {"batch_sizes": [1, 2], "updates": [1, 2], "replica_norms": [0.1, math.nan]},
            "Rank 1: the replica norm is not finite",
        ),
        (
            {"batch_sizes": [1, 2], "updates": [1, 2], "replica_norms": [math.inf, 0.1]},
            "Rank 0: the replica norm is not finite",
        ),
        (
            {"batch_sizes": [1, 2], "updates": [1, 2], "replica_norms": [-0.1, 0.1]},
            "negative replica norm",
        ),
        (
            {"batch_sizes": [1, 2], "updates": [1, 2], "replica_norms": [0.1]},
            "1 replica norms for 2 ranks",
        ),
    ],
)
def test_merge_weights_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        merge_weights(**kwargs)


# --- check_merge_options ----------------------------------------------------------------------


def test_check_merge_options_accepts_defaults_and_edges() -> None:
    check_merge_options(0.1, 0.9, 0.1, None, None)
    check_merge_options(0.0, 0.0, 1e-9, 64, 64)
    check_merge_options(0.1, 0.9, 0.1, 1, None)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-0.5, 0.9, 0.1, None, None), "negative delta"),
        ((1.0, 0.9, 0.1, None, None), r"delta must be in \[0, 1\)"),
        ((0.1, -0.1, 0.1, None, None), "negative gamma"),
        ((0.1, 1.0, 0.1, None, None), r"gamma must be in \[0, 1\), got 1.0"),
        ((0.1, math.nan, 0.1, None, None), "gamma must be finite"),
        ((0.1, 0.9, 0.0, None, None), "threshold must be > 0"),
        ((0.1, 0.9, math.nan, None, None), "threshold must be > 0"),
        ((0.1, 0.9, 0.1, 0, None), "megabatch_size must be >= 1, got 0"),
        ((0.1, 0.9, 0.1, 2.5, None), "megabatch_size must be an int"),
        ((0.1, 0.9, 0.1, True, None), "megabatch_size must be an int"),
        ((0.1, 0.9, 0.1, 100, 128), "megabatch_size 100 .* global batch size 128"),
    ],
)
def test_check_merge_options_errors(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_merge_options(*args)


# --- momentum_merge ---------------------------------------------------------------------------


def test_momentum_zero_is_the_plain_average() -> None:
    assert momentum_merge(2.5, 10.0, 3.0, 0.0) == 2.5


def test_momentum_example_numbers() -> None:
    # merged + 0.9 * (current - previous) = 1.0 + 0.9 * (2.0 - 1.5)
    assert momentum_merge(1.0, 2.0, 1.5, 0.9) == pytest.approx(1.45)


def test_momentum_on_tensors() -> None:
    merged = torch.tensor([1.0, -1.0])
    current = torch.tensor([2.0, 0.0])
    previous = torch.tensor([1.5, 1.0])
    result = momentum_merge(merged, current, previous, 0.9)
    torch.testing.assert_close(result, torch.tensor([1.45, -1.9]))
    # The inputs are left untouched.
    torch.testing.assert_close(merged, torch.tensor([1.0, -1.0]))


def test_weighted_average_then_momentum_end_to_end() -> None:
    replicas = [torch.tensor([0.0, 4.0]), torch.tensor([2.0, 0.0])]
    weights = merge_weights([10, 30], [1, 3]).weights  # [0.25, 0.75]
    merged = sum(w * r for w, r in zip(weights, replicas))
    result = momentum_merge(merged, torch.tensor([1.0, 1.0]), torch.tensor([0.0, 2.0]), 0.5)
    torch.testing.assert_close(result, torch.tensor([2.0, 0.5]))


# ---------------------------------------------------------------- issue 41: local steps, outer step
def test_outer_step_is_nesterov_on_the_pseudo_gradient_by_hand() -> None:
    # g = 1.0 - 0.8 = 0.2; v = 0.2; w = 1.0 - 0.5 * (0.2 + 0.9 * 0.2) = 0.81
    new, velocity = outer_step(1.0, 0.8, None, 0.5)
    assert new == pytest.approx(0.81) and velocity == pytest.approx(0.2)
    # g = 0.81 - 0.71 = 0.1; v = 0.9 * 0.2 + 0.1 = 0.28; w = 0.81 - 0.5 * (0.1 + 0.9 * 0.28)
    new, velocity = outer_step(new, 0.71, velocity, 0.5)
    assert new == pytest.approx(0.634) and velocity == pytest.approx(0.28)


def test_outer_step_at_lr_one_without_momentum_is_the_merged_model() -> None:
    assert outer_step(1.0, 0.8, None, 1.0, momentum=0.0)[0] == pytest.approx(0.8)


def test_outer_step_matches_torch_sgd_with_nesterov_on_tensors() -> None:
    anchor = torch.tensor([1.0, -2.0, 0.5])
    reference = torch.nn.Parameter(anchor.clone())
    sgd = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=True)
    velocity = None
    for merged_offset in ([0.1, 0.2, -0.3], [0.05, -0.1, 0.2], [0.3, 0.0, 0.1]):
        merged = anchor - torch.tensor(merged_offset)
        reference.grad = (anchor - merged).clone()  # the pseudo-gradient
        sgd.step()
        anchor, velocity = outer_step(anchor, merged, velocity, 0.7)
        assert torch.allclose(anchor, reference.detach(), atol=1e-6)


def test_claims_from_a_shared_pool_follow_speed_with_even_batches() -> None:
    # proportional local steps: a 3x faster rank makes 3x the updates in the same wall time
    counts = Counter(rank for rank, _ in claim_order([1.0, 3.0], [32, 32], 1280))
    assert counts == {0: 30, 1: 10}
    counts = Counter(rank for rank, _ in claim_order([1.0, 1.0, 1.0, 3.0], [32] * 4, 1280))
    assert counts == {0: 12, 1: 12, 2: 12, 3: 4}
    # paper 004's equal-updates rule: batch sizes in proportion to speed, equal counts
    counts = Counter(rank for rank, _ in claim_order([1.0, 3.0], [96, 32], 1280))
    assert counts == {0: 10, 1: 10}
    claims = claim_order([1.0, 3.0], [32, 32], 100)
    assert sum(size for _, size in claims) == 100 and claims[-1] == (0, 4)  # the rest


def test_both_local_step_rules_merge_by_samples() -> None:
    # proportional: even batches, counts 30 : 10 -> the samples' shares
    assert sample_weights([30 * 32, 10 * 32], [32, 32]).weights == [0.75, 0.25]
    # equal updates: batches 96 : 32, the same counts -> the batch shares, the same weights
    assert merge_weights([96, 32], [10, 10]).weights == [0.75, 0.25]
    weights = sample_weights([0, 0], [16, 48])  # nothing trained yet: the batch shares
    assert weights.weights == [0.25, 0.75] and weights.basis == "batch"
    with pytest.raises(ValueError, match="one of each per rank"):
        sample_weights([1], [1, 2])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("even", None, 0.0), "local_steps"),
        (("equal", 0.0, 0.0), "outer_lr"),
        (("equal", math.nan, 0.0), "outer_lr"),
        (("equal", "0.7", 0.0), "outer_lr"),
        (("equal", 0.7, 0.5), "both momentum"),
    ],
)
def test_local_options_are_refused_at_once(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_local_options(*args)
    check_local_options("proportional", 0.7, 0.0)  # fine
