"""One validation path (issue 20 point 2, issue 17 points 6, 8 and 9): the same table of argument
types through every entry point, lengths in every container, and the edges that leaked
OverflowError, ZeroDivisionError or a wrong message before."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqbal import (
    CostModel,
    balance_batch,
    best_fit_decreasing_partitions,
    build_dp_schedule,
    calculate_workload,
    capped_balanced_partitions,
    ceildiv,
    first_fit_partitions,
    get_seqlen_balanced_partitions,
    karmarkar_karp,
    make_workload_fn,
    packing_lower_bound,
    plan_data_parallel,
    plan_micro_batches,
    roundup_divisible,
    split_bins_to_count,
)
from seqbal.partition import smallest_feasible_partitions
from seqbal.validation import int_argument, int_array

NUMPY_INTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
#: The argument-type table: how a value of 2..100 is passed, and whether it must be accepted.
ACCEPTED = [("int", int)] + [(t.__name__, t) for t in NUMPY_INTS]
REJECTED = [("bool", lambda v: True), ("float", float), ("str", str)]

LENGTHS = [30, 10, 25, 40, 5, 15, 20, 35]
WORK = calculate_workload(LENGTHS)

#: Every integer argument of every entry point: (name, call taking the argument's value, the
#: value used, whether None is accepted).
ENTRY_POINTS = [
    ("plan.max_token_len", lambda v: plan_micro_batches(LENGTHS, v), 100, False),
    ("plan.num_batches_divided_by", lambda v: plan_micro_batches(LENGTHS, 100, num_batches_divided_by=v), 2, True),
    ("plan.min_num_micro_batch", lambda v: plan_micro_batches(LENGTHS, 100, min_num_micro_batch=v), 3, True),
    ("plan.force_group_size", lambda v: plan_micro_batches(LENGTHS, 100, force_group_size=v), 2, False),
    ("plan_dp.max_token_len", lambda v: plan_data_parallel([LENGTHS, LENGTHS[::-1]], v), 100, False),
    ("plan_dp.num_batches_divided_by",
     lambda v: plan_data_parallel([LENGTHS, LENGTHS[::-1]], 100, num_batches_divided_by=v), 2, True),
    ("plan_dp.min_num_micro_batch",
     lambda v: plan_data_parallel([LENGTHS, LENGTHS[::-1]], 100, min_num_micro_batch=v), 3, True),
    ("plan_dp.force_group_size", lambda v: plan_data_parallel([LENGTHS, LENGTHS[::-1]], 100, force_group_size=v), 2, False),
    ("schedule.dp_size", lambda v: build_dp_schedule(LENGTHS, v, 100).micro_batches, 2, False),
    ("schedule.max_token_len", lambda v: build_dp_schedule(LENGTHS, 2, v).micro_batches, 100, False),
    ("schedule.num_batches_divided_by",
     lambda v: build_dp_schedule(LENGTHS, 2, 100, num_batches_divided_by=v).micro_batches, 2, True),
    ("schedule.min_num_micro_batch",
     lambda v: build_dp_schedule(LENGTHS, 2, 100, min_num_micro_batch=v).micro_batches, 3, True),
    ("schedule.force_group_size", lambda v: build_dp_schedule(LENGTHS, 2, 100, force_group_size=v).micro_batches, 2, False),
    ("balance_batch.dp_size", lambda v: balance_batch(LENGTHS, v)[0], 2, False),
    ("CostModel.round_to", lambda v: CostModel(round_to=v), 4, False),
    ("CostModel.pack_round_to", lambda v: CostModel(pack_round_to=v), 8, False),
    ("plan.cost_model.round_to", lambda v: plan_micro_batches(LENGTHS, 100, cost_model=CostModel(round_to=v)), 4, False),
    ("schedule.cost_model.pack_round_to",
     lambda v: build_dp_schedule(LENGTHS, 2, 100, cost_model=CostModel(pack_round_to=v)).micro_batches, 8, False),
    ("karmarkar_karp.k_partitions", lambda v: karmarkar_karp(LENGTHS, v, False), 3, False),
    ("get_seqlen_balanced_partitions.k_partitions", lambda v: get_seqlen_balanced_partitions(LENGTHS, v, True), 2, False),
    ("packing_lower_bound.capacity", lambda v: packing_lower_bound(LENGTHS, v), 100, False),
    ("first_fit_partitions.capacity", lambda v: first_fit_partitions(LENGTHS, v), 100, False),
    ("best_fit_decreasing_partitions.capacity", lambda v: best_fit_decreasing_partitions(LENGTHS, v), 100, False),
    ("split_bins_to_count.target", lambda v: split_bins_to_count([list(range(8))], LENGTHS, v), 3, False),
    ("capped_balanced_partitions.capacity", lambda v: capped_balanced_partitions(LENGTHS, WORK, v, 3), 100, False),
    ("capped_balanced_partitions.k", lambda v: capped_balanced_partitions(LENGTHS, WORK, 100, v), 3, False),
    ("smallest_feasible_partitions.capacity", lambda v: smallest_feasible_partitions(LENGTHS, WORK, v), 100, False),
    ("smallest_feasible_partitions.min_count",
     lambda v: smallest_feasible_partitions(LENGTHS, WORK, 100, min_count=v), 3, False),
    ("smallest_feasible_partitions.step", lambda v: smallest_feasible_partitions(LENGTHS, WORK, 100, step=v), 2, False),
    ("ceildiv.a", lambda v: ceildiv(v, 3), 7, False),
    ("ceildiv.b", lambda v: ceildiv(7, v), 3, False),
    ("roundup_divisible.a", lambda v: roundup_divisible(v, 4), 7, False),
    ("roundup_divisible.b", lambda v: roundup_divisible(7, v), 4, False),
    ("make_workload_fn.hidden_size", lambda v: make_workload_fn(v)([10, 20]).tolist(), 16, False),
]
IDS = [name for name, *_ in ENTRY_POINTS]


@pytest.mark.parametrize("kind, make", ACCEPTED, ids=[k for k, _ in ACCEPTED])
@pytest.mark.parametrize("name, call, value, optional", ENTRY_POINTS, ids=IDS)
def test_every_integer_type_is_taken_as_its_value(name, call, value, optional, kind, make):
    assert call(make(value)) == call(value)


@pytest.mark.parametrize("kind, make", REJECTED, ids=[k for k, _ in REJECTED])
@pytest.mark.parametrize("name, call, value, optional", ENTRY_POINTS, ids=IDS)
def test_bools_floats_and_strings_are_value_errors(name, call, value, optional, kind, make):
    with pytest.raises(ValueError, match=repr(make(value)).replace(".", r"\.")):
        call(make(value))


@pytest.mark.parametrize("name, call, value, optional", ENTRY_POINTS, ids=IDS)
def test_none_is_taken_only_where_it_is_optional(name, call, value, optional):
    if optional:
        call(None)  # "no constraint"
    else:
        with pytest.raises(ValueError, match="None"):
            call(None)


def test_padded_takes_bools_only():
    assert CostModel(padded=np.bool_(True)) == CostModel(padded=True)
    for value in (1, np.int8(1), 1.0, "yes", None):
        with pytest.raises(ValueError, match="padded must be True or False"):
            CostModel(padded=value)


# ------------------------------------------------------------------ lengths in every container

LENGTH_DTYPES = NUMPY_INTS
TORCH_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64)
LENGTH_CALLS = [
    ("plan", lambda lengths: plan_micro_batches(lengths, 100)),
    ("schedule", lambda lengths: build_dp_schedule(lengths, 2, 100).micro_batches),
    ("balance_batch", lambda lengths: balance_batch(lengths, 2)[0]),
    ("karmarkar_karp", lambda lengths: karmarkar_karp(lengths, 3, False)),
    ("bfd", lambda lengths: best_fit_decreasing_partitions(lengths, 100)),
    ("packing_lower_bound", lambda lengths: packing_lower_bound(lengths, 100)),
    ("capped", lambda lengths: capped_balanced_partitions(lengths, WORK, 100, 3)),
    ("calculate_workload", lambda lengths: np.asarray(calculate_workload(lengths)).tolist()),
]


@pytest.mark.parametrize("container", [*(np.dtype(t).name for t in LENGTH_DTYPES), *(str(t) for t in TORCH_DTYPES)])
@pytest.mark.parametrize("name, call", LENGTH_CALLS, ids=[n for n, _ in LENGTH_CALLS])
def test_lengths_of_every_integer_dtype_give_the_list_result(name, call, container):
    if container.startswith("torch."):
        lengths = torch.tensor(LENGTHS, dtype=getattr(torch, container[len("torch."):]))
    else:
        lengths = np.array(LENGTHS, dtype=container)
    assert call(lengths) == call(LENGTHS)


@pytest.mark.parametrize(
    "lengths",
    [np.array([3, 2**63 + 5], dtype=np.uint64), torch.tensor([3, 2**63 + 5], dtype=torch.uint64), [3, 2**63 + 5], [3, 2**64]],
    ids=["uint64 array", "uint64 tensor", "list", "list beyond uint64"],
)
@pytest.mark.parametrize("name, call", LENGTH_CALLS, ids=[n for n, _ in LENGTH_CALLS])
def test_lengths_beyond_int64_are_too_large_never_negative(name, call, lengths):
    with pytest.raises(ValueError, match=r"beyond int64|more than seqbal counts in int64") as info:
        call(lengths)
    assert "negative" not in str(info.value)


@pytest.mark.parametrize("name, call", LENGTH_CALLS[:-1], ids=[n for n, _ in LENGTH_CALLS[:-1]])
def test_negative_lengths_are_refused_everywhere(name, call):
    lengths = [30, 10, -25, 40, 5, 15, 20, 35]
    with pytest.raises(ValueError, match=r"negative.*-25|-25.*negative|item 2 is negative|sample 2 has a negative"):
        call(lengths)


# ------------------------------------------------------------------ issue 17 point 8: no type leaks


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ceildiv(7, 0), r"ceildiv\(7, 0\): the divisor must not be 0"),
        (lambda: roundup_divisible(7, 0), "b must be a positive int, got 0"),
        (lambda: first_fit_partitions([6, 5], 2**64), "capacity=18446744073709551616 is too large"),
        (lambda: best_fit_decreasing_partitions([6, 5], 2**64), "capacity=18446744073709551616 is too large"),
        (lambda: packing_lower_bound([7, 3], 2**64), "capacity=18446744073709551616 is too large"),
        (lambda: calculate_workload([2**64]), "18446744073709551616, beyond int64"),
        (lambda: calculate_workload(torch.tensor([2**63 + 1], dtype=torch.uint64)), "beyond int64"),
        (lambda: calculate_workload([2**62]), r"24576 \* s \+ s\*\*2 = .* beyond int64"),
        (lambda: make_workload_fn(True), "hidden_size must be a positive int, got True"),
        (lambda: make_workload_fn(0), "hidden_size must be a positive int, got 0"),
        (lambda: packing_lower_bound([7, -3], 10), r"item 1 is negative \(-3\)"),
        (lambda: capped_balanced_partitions([7, -3], [1, 1], 10, 1), r"item 1 is negative \(-3\)"),
        (lambda: capped_balanced_partitions([7, 3], [1, -1], 10, 1), r"item 1 is negative \(-1\)"),
    ],
)
def test_edges_are_value_errors_with_the_number(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_unsigned_scalars_never_wrap():
    assert ceildiv(7, np.uint8(3)) == 3 and type(ceildiv(7, np.uint8(3))) is int
    assert ceildiv(np.uint64(2**64 - 1), 2) == 2**63
    assert roundup_divisible(np.uint8(250), np.uint8(8)) == 256
    assert make_workload_fn(np.int64(1024))([10]).tolist() == [61540]
    # np.uint8(200) divisors times 2 ranks wrapped to 144 (uint8) before the conversion
    schedule = build_dp_schedule(list(range(1, 401)), np.uint8(2), np.uint16(4096), num_batches_divided_by=np.uint8(200))
    assert schedule.num_micro_batches == 200


# ------------------------------------------------------------------ the module itself


def test_int_argument_bounds_and_returns_python_ints():
    assert type(int_argument("x", np.uint64(2**63 - 1))) is int
    with pytest.raises(ValueError, match="x=9223372036854775808 is too large"):
        int_argument("x", np.uint64(2**63))
    assert int_argument("x", 2**70, maximum=None) == 2**70
    with pytest.raises(ValueError, match="x must be an int >= 0, got -1"):
        int_argument("x", -1, minimum=0, expected="an int >= 0")


def test_int_array_options():
    assert int_array([1.0, 2.0]).tolist() == [1, 2]  # the partitioner's helpers take whole floats
    with pytest.raises(ValueError, match="must hold integers, got dtype float64"):
        int_array([1.0, 2.0], integral_floats=False)
    with pytest.raises(ValueError, match="the batch is empty"):
        int_array([], empty="the batch is empty")
    assert int_array([-1, 2], negative=True).tolist() == [-1, 2]
    with pytest.raises(ValueError, match="meta device"):
        int_array(torch.ones(3, dtype=torch.long, device="meta"))
    with pytest.raises(ValueError, match="one-dimensional"):
        int_array([[1, 2]])
