"""Issue 13's edges (and issue 11's API errors) on one process: jagged lengths with holes, masks
that are not 0/1, NumPy scalar arguments, batches that cannot be indexed, non-group
``dp_group``s, errors that cross a process boundary, and inputs that used to escape as
OverflowError, NotImplementedError or AttributeError. The distributed halves (mismatched
arguments across ranks, a bad container agreed before the first all-reduce) are scenarios of
``tests/distributed_workers.py``."""

from __future__ import annotations

import copy
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from seqbal import MicroBatchPlanError, effective_lengths, plan_micro_batches, rearrange_micro_batches

from .invariants import assert_plan_invariants

# ------------------------------------------------------------------ 13.2 jagged lengths()


def _holed_input_ids() -> torch.Tensor:
    """Three rows of 10 tokens each, whose offsets are only 2 apart (a view with holes)."""
    return torch.nested.nested_tensor_from_jagged(
        torch.arange(40), offsets=torch.tensor([0, 2, 4, 6]), lengths=torch.tensor([10, 10, 10])
    )


def _narrowed_input_ids() -> torch.Tensor:
    """Rows 3, 4 and 5 tokens long, cut out of a (3, 10) tensor with torch.nested.narrow."""
    return torch.nested.narrow(
        torch.arange(30).view(3, 10), 1, torch.tensor([0, 2, 1]), torch.tensor([3, 4, 5]), layout=torch.jagged
    )


@pytest.mark.parametrize(
    "make, expected", [(_holed_input_ids, [10, 10, 10]), (_narrowed_input_ids, [3, 4, 5])], ids=["lengths", "narrow"]
)
def test_jagged_input_ids_with_lengths_are_measured_by_lengths(make, expected):
    input_ids = make()
    assert input_ids.lengths() is not None  # the case under test: offsets() alone would be wrong
    batch = TensorDict({"input_ids": input_ids}, batch_size=[3])
    assert effective_lengths(batch).tolist() == expected
    cap = 10
    micro_batches, indices = rearrange_micro_batches(batch, cap)
    assert_plan_invariants(expected, indices, cap)
    for micro_batch, part in zip(micro_batches, indices):
        tokens = sum(row.numel() for row in micro_batch["input_ids"].unbind())
        assert tokens == sum(expected[i] for i in part) and tokens <= cap


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_strided_nested_input_ids_is_a_value_error():
    strided = torch.nested.nested_tensor([torch.arange(3), torch.arange(5)], layout=torch.strided)
    with pytest.raises(ValueError, match=r"layout torch\.strided.*layout=torch\.jagged"):
        rearrange_micro_batches(TensorDict({"input_ids": strided}, batch_size=[2]), 10)


# ------------------------------------------------------------------ 13.4 masks hold 0 and 1


@pytest.mark.parametrize(
    "value, dtype, shown",
    [
        (0.999, torch.float32, "0.999"),
        (0.5, torch.float64, "0.5"),
        (2, torch.int64, "2"),
        (-1, torch.int32, "-1"),
        (float("nan"), torch.float32, "nan"),
        (2.0, torch.bfloat16, "2"),
    ],
)
def test_mask_that_is_not_zero_one_is_a_value_error(value, dtype, shown):
    mask = torch.zeros(64, 512, dtype=dtype)
    mask[:, :3] = 1
    mask[7, 100] = value
    batch = TensorDict({"attention_mask": mask}, batch_size=[64])
    with pytest.raises(ValueError, match=rf"attention_mask must be bool or hold only 0 and 1, got {shown} at \[7, 100\]"):
        rearrange_micro_batches(batch, 4)
    with pytest.raises(ValueError, match="only 0 and 1"):
        effective_lengths(batch)


def test_whole_nan_mask_is_rejected_not_one_micro_batch():
    batch = TensorDict({"attention_mask": torch.full((64, 512), float("nan"))}, batch_size=[64])
    with pytest.raises(ValueError, match="only 0 and 1"):
        rearrange_micro_batches(batch, 4)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32])
def test_zero_one_masks_of_every_dtype_count_tokens(dtype):
    lengths = [5, 0, 17, 3]
    mask = (torch.arange(20)[None, :] < torch.tensor(lengths)[:, None]).to(dtype)
    assert effective_lengths(TensorDict({"attention_mask": mask}, batch_size=[4])).tolist() == lengths


def test_complex_mask_is_rejected():
    batch = TensorDict({"attention_mask": torch.ones(2, 3, dtype=torch.complex64)}, batch_size=[2])
    with pytest.raises(ValueError, match="complex"):
        rearrange_micro_batches(batch, 10)


# ------------------------------------------------------------------ 13.5 NumPy scalar arguments


def test_numpy_unsigned_divisor_is_used_as_an_int():
    parts = plan_micro_batches([5] * 12, 100, num_batches_divided_by=np.uint32(2))
    assert len(parts) == 2
    assert_plan_invariants([5] * 12, parts, 100, num_batches_divided_by=2)


def test_numpy_unsigned_minimum_is_used_as_an_int():
    parts = plan_micro_batches([5] * 12, 10, min_num_micro_batch=np.uint64(3))
    assert len(parts) == 6
    parts = plan_micro_batches([5] * 12, 100, min_num_micro_batch=np.uint64(3))
    assert len(parts) == 3


def test_numpy_int16_cap_does_not_overflow_once_the_total_passes_int16():
    lengths = [4000] * 12  # 48,000 tokens: more than an int16 holds
    parts = plan_micro_batches(lengths, np.int16(4096))
    assert len(parts) == 12
    assert_plan_invariants(lengths, parts, 4096)


def test_numpy_scalar_force_group_size_and_tensor_batch_agree_with_ints():
    lengths = [3, 5, 2, 6, 1, 1]
    assert plan_micro_batches(lengths, 8, force_group_size=np.int8(2)) == plan_micro_batches(lengths, 8, force_group_size=2)


@pytest.mark.parametrize("name", ["max_token_len", "num_batches_divided_by", "min_num_micro_batch", "force_group_size"])
@pytest.mark.parametrize("value", [True, np.bool_(True)])
def test_bools_stay_rejected_as_arguments(name, value):
    kwargs = {"max_token_len": 100, name: value}
    with pytest.raises(ValueError, match=name):
        plan_micro_batches([1, 2], **kwargs)


# ------------------------------------------------------------------ 13.6 / issue 11 containers


@pytest.mark.parametrize(
    "batch, pattern",
    [
        ({"attention_mask": torch.ones(3, 4, dtype=torch.long)}, r"got a dict with keys \['attention_mask'\]"),
        (torch.ones(3, 4, dtype=torch.long), r"got a Tensor of shape \(3, 4\)"),
        ("batch", r"got a str"),
    ],
    ids=["dict", "tensor", "str"],
)
def test_batch_that_is_not_a_tensordict_is_a_value_error_before_planning(batch, pattern, monkeypatch):
    _forbid_planning(monkeypatch)
    with pytest.raises(ValueError, match=r"batch must be a tensordict\.TensorDict with batch_size \[B\], " + pattern):
        rearrange_micro_batches(batch, 10)


def test_tensordict_without_batch_dimension_is_a_value_error_before_planning(monkeypatch):
    _forbid_planning(monkeypatch)
    batch = TensorDict({"attention_mask": torch.ones(3, 4, dtype=torch.long)}, batch_size=[])
    with pytest.raises(ValueError, match=r"batch must have a batch dimension .* got batch_size \[\]"):
        rearrange_micro_batches(batch, 10)


def test_mask_of_halves_and_twos_is_a_value_error_before_planning(monkeypatch):
    _forbid_planning(monkeypatch)
    for value in (0.5, 2):
        batch = TensorDict({"attention_mask": torch.full((3, 4), value)}, batch_size=[3])
        with pytest.raises(ValueError, match=f"got {value}"):
            rearrange_micro_batches(batch, 10)


def _forbid_planning(monkeypatch) -> None:
    """Make any planning work fail loudly, so a test proves its error came first."""
    from seqbal.plan import local as plan_module  # the module that calls _local_plan

    def no_planning(*args, **kwargs):
        raise AssertionError("planning started before the input was rejected")

    monkeypatch.setattr(plan_module, "_local_plan", no_planning)


# ------------------------------------------------------------------ 13.7 dp_group type


@pytest.mark.parametrize("group", ["world", 0, 3.5, object()], ids=["str", "int", "float", "object"])
@pytest.mark.parametrize("same_micro_num_in_dp", [True, False])
def test_dp_group_that_is_not_a_process_group_is_a_value_error(group, same_micro_num_in_dp, monkeypatch):
    _forbid_planning(monkeypatch)
    with pytest.raises(ValueError, match=r"dp_group must be None or a torch\.distributed ProcessGroup"):
        plan_micro_batches([1, 2], 10, dp_group=group, same_micro_num_in_dp=same_micro_num_in_dp)
    batch = TensorDict({"attention_mask": torch.ones(2, 3, dtype=torch.long)}, batch_size=[2])
    with pytest.raises(ValueError, match=f"got {type(group).__name__}"):
        rearrange_micro_batches(batch, 10, dp_group=group)


# ------------------------------------------------------------------ 13.8 errors cross processes


def _an_error() -> MicroBatchPlanError:
    with pytest.raises(MicroBatchPlanError) as info:
        plan_micro_batches([5, 3], 4)
    return info.value


@pytest.mark.parametrize("copy_of", [lambda e: pickle.loads(pickle.dumps(e)), copy.deepcopy, copy.copy], ids=["pickle", "deepcopy", "copy"])
def test_plan_error_survives_pickle_and_copies(copy_of):
    error = _an_error()
    clone = copy_of(error)
    assert type(clone) is MicroBatchPlanError and isinstance(clone, ValueError)
    assert str(clone) == str(error) and "exceeds max_token_len" in str(clone)
    assert clone.code == error.code == MicroBatchPlanError.SAMPLE_EXCEEDS


def test_plan_error_raised_in_a_process_pool_worker_reaches_the_caller():
    context = multiprocessing.get_context("spawn")  # the worker imports only seqbal and NumPy
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        future = pool.submit(plan_micro_batches, [5, 3], 4)
        with pytest.raises(MicroBatchPlanError) as info:
            future.result(timeout=120)
        assert info.value.code == MicroBatchPlanError.SAMPLE_EXCEEDS
        assert "sample 0 has 5 tokens, which exceeds max_token_len=4" in str(info.value)
        # the pool survived: a second job still runs
        assert pool.submit(plan_micro_batches, [1, 2], 4).result(timeout=120) == [[0, 1]]


# ------------------------------------------------------------------ 13.9 escapes


@pytest.mark.parametrize("name", ["max_token_len", "num_batches_divided_by", "min_num_micro_batch", "force_group_size"])
def test_arguments_beyond_int64_are_value_errors(name):
    kwargs = {"max_token_len": 100, name: 2**63}
    with pytest.raises(ValueError, match=rf"{name}=9223372036854775808 is too large"):
        plan_micro_batches([1, 2], **kwargs)


def test_largest_int64_cap_still_plans():
    assert plan_micro_batches([1, 2], 2**63 - 1) == [[0, 1]]


def test_uint64_lengths_beyond_int64_are_too_large_not_negative():
    lengths = np.array([3, 2**63 + 5], dtype=np.uint64)
    with pytest.raises(ValueError, match=r"sample 1 has 9223372036854775813 tokens, more than"):
        plan_micro_batches(lengths, 100)


def test_meta_tensors_are_value_errors():
    with pytest.raises(ValueError, match="meta device"):
        plan_micro_batches(torch.ones(3, dtype=torch.long, device="meta"), 10)
    batch = TensorDict({"attention_mask": torch.ones(3, 4, dtype=torch.long, device="meta")}, batch_size=[3])
    with pytest.raises(ValueError, match="attention_mask is on the meta device"):
        rearrange_micro_batches(batch, 10)


def test_bool_lengths_are_rejected_as_tensor_list_and_array():
    for lengths in ([True, False], np.array([True, False]), torch.tensor([True, False])):
        with pytest.raises(ValueError, match="must hold integers"):
            plan_micro_batches(lengths, 10)


# ------------------------------------------------------------------ properties

_NUMPY_INTS = (np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=40),
    cap_extra=st.integers(0, 700),
    divisor=st.one_of(st.none(), st.integers(1, 4)),
    minimum=st.one_of(st.none(), st.integers(1, 4)),
    kind=st.sampled_from(_NUMPY_INTS),
)
def test_numpy_integer_arguments_plan_exactly_like_python_ints(lengths, cap_extra, divisor, minimum, kind):
    cap = max(lengths) + cap_extra + 1  # every sample fits; int16 holds it
    as_python = dict(max_token_len=cap, num_batches_divided_by=divisor, min_num_micro_batch=minimum)
    as_numpy = {name: None if value is None else kind(value) for name, value in as_python.items()}
    try:
        expected = plan_micro_batches(lengths, **as_python)
    except MicroBatchPlanError as error:
        with pytest.raises(MicroBatchPlanError) as info:
            plan_micro_batches(lengths, **as_numpy)
        assert (str(info.value), info.value.code) == (str(error), error.code)
        return
    assert plan_micro_batches(lengths, **as_numpy) == expected
    assert_plan_invariants(lengths, expected, cap, num_batches_divided_by=divisor, min_num_micro_batch=minimum)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.lists(st.sampled_from([0, 1, 0, 1, 2, -1, 0.5]), min_size=1, max_size=12), min_size=1, max_size=8),
    dtype=st.sampled_from([torch.int64, torch.int32, torch.float32, torch.float64]),
)
def test_a_mask_is_counted_iff_it_holds_only_zeros_and_ones(rows, dtype):
    width = max(len(row) for row in rows)
    values = [row + [0] * (width - len(row)) for row in rows]
    mask = torch.tensor(values, dtype=torch.float64).to(dtype)  # 0.5 truncates to 0 in an int mask
    batch = TensorDict({"attention_mask": mask}, batch_size=[len(rows)])
    stored = mask.double()
    if bool(((stored == 0) | (stored == 1)).all()):
        assert effective_lengths(batch).tolist() == [int(row.sum()) for row in stored]
    else:
        with pytest.raises(MicroBatchPlanError, match="only 0 and 1"):
            effective_lengths(batch)


# ------------------------------------------------------------------ issue 17


@pytest.mark.parametrize("field_name", ["round_to", "pack_round_to"])
def test_cost_model_fields_beyond_int64_are_bad_arguments_with_the_number(field_name):
    from seqbal import CostModel, plan_data_parallel

    model = CostModel(**{field_name: 2**64})
    pattern = rf"cost_model\.{field_name}=18446744073709551616 is too large"
    with pytest.raises(MicroBatchPlanError, match=pattern) as info:
        plan_micro_batches([1, 2], 100, cost_model=model)
    assert info.value.code == MicroBatchPlanError.BAD_ARGUMENT
    with pytest.raises(ValueError, match=pattern):
        plan_data_parallel([[1, 2], [3]], 100, cost_model=model)
    batch = TensorDict({"attention_mask": torch.ones(2, 3, dtype=torch.long)}, batch_size=[2])
    with pytest.raises(ValueError, match=pattern):
        rearrange_micro_batches(batch, 100, cost_model=model)
    assert plan_micro_batches([1, 2], 2**62, cost_model=CostModel(**{field_name: 2**20})) == [[0, 1]]


def _two_values():
    return torch.tensor([1, 0])


@pytest.mark.parametrize("value", [_two_values(), np.array([True, False])], ids=["tensor", "array"])
@pytest.mark.parametrize("name", ["same_micro_num_in_dp", "use_dynamic_bsz_balance"])
def test_flag_of_several_values_is_a_value_error(name, value):
    from seqbal import plan_data_parallel

    with pytest.raises(MicroBatchPlanError, match=rf"{name} must be True or False, got a \w+ of shape \(2,\)"):
        plan_micro_batches([1, 2], 10, **{name: value})
    batch = TensorDict({"attention_mask": torch.ones(2, 3, dtype=torch.long)}, batch_size=[2])
    with pytest.raises(ValueError, match=f"{name} must be True or False"):
        rearrange_micro_batches(batch, 10, **{name: value})
    if name == "use_dynamic_bsz_balance":
        with pytest.raises(ValueError, match=f"{name} must be True or False"):
            plan_data_parallel([[1, 2]], 10, use_dynamic_bsz_balance=value)
    assert plan_micro_batches([1, 2], 10, **{name: torch.tensor(True)}) == [[0, 1]]  # one value reads fine


def test_trim_padding_flag_of_several_values_is_a_value_error():
    batch = TensorDict({"attention_mask": torch.ones(2, 3, dtype=torch.long)}, batch_size=[2])
    with pytest.raises(ValueError, match=r"trim_padding must be True or False, got a Tensor of shape \(2,\)"):
        rearrange_micro_batches(batch, 10, trim_padding=_two_values())


@pytest.mark.parametrize("cap", [-1, 0, True, 2.5, None])
def test_micro_batch_summary_rejects_a_cap_that_is_not_positive(cap):
    from seqbal import micro_batch_summary

    with pytest.raises(ValueError, match=rf"max_token_len must be a positive int, got {cap!r}"):
        micro_batch_summary([4, 4], [[0, 1]], cap)


_HUGE_DIVISOR_SCRIPT = """
import sys
from seqbal import build_dp_schedule
try:
    build_dp_schedule([5] * 16, 2, 100, num_batches_divided_by=2**40{extra})
except ValueError as error:
    print(error)
    sys.exit(0)
sys.exit(1)
"""


@pytest.mark.parametrize("extra", ["", ", cost_model='padded'", ", min_num_micro_batch=3"])
def test_huge_divisor_in_the_schedule_is_an_error_at_once(extra):
    """Issue 17.5: the advice used to loop over every divisor below 2**40 (hours). The timeout is a
    hang guard, generous for a loaded machine, not a performance threshold."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _HUGE_DIVISOR_SCRIPT.format(extra=extra)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "Cannot satisfy max_token_len=100" in result.stdout
    assert "lower num_batches_divided_by to 8" in result.stdout  # 16 groups, 2 ranks: 8 per rank


def test_huge_divisor_in_the_cli_schedule_route_exits_2_at_once(tmp_path):
    import subprocess
    import sys

    lengths = tmp_path / "lengths.txt"
    lengths.write_text("5\n" * 8)
    result = subprocess.run(
        [sys.executable, "-m", "seqbal", "plan", str(lengths), "--route", "schedule", "--dp", "2",
         "--divisible-by", str(2**40), "--max-token-len", "100", "--compare", "off"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "lower num_batches_divided_by to 4" in result.stderr


@settings(max_examples=300, deadline=None)
@given(
    floor=st.integers(1, 200),
    dp_size=st.integers(1, 6),
    divisor=st.integers(1, 300),
    num_groups=st.integers(1, 400),
)
def test_divisor_advice_is_the_largest_divisor_that_fits(floor, dp_size, divisor, num_groups):
    from seqbal.partition import roundup_divisible
    from seqbal.schedule import _largest_fitting_divisor

    fitting = [d for d in range(divisor, 0, -1) if roundup_divisible(floor, dp_size * d) <= num_groups]
    advised = _largest_fitting_divisor(floor, dp_size, divisor, num_groups)
    assert advised == (fitting[0] if fitting else None)


class _DataProto:
    """What the verl adapter reads of verl's DataProto."""

    def __init__(self, batch=None, non_tensor_batch=None, meta_info=None):
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info

    def __len__(self):
        return self.batch.batch_size[0]


def _verl_batch(n=3):
    return TensorDict({"attention_mask": torch.ones(n, 4, dtype=torch.long)}, batch_size=[n])


@pytest.mark.parametrize(
    "data, pattern",
    [
        (_DataProto(None, {}, {}), "prepare_dynamic_batch needs data.batch"),
        (object(), "prepare_dynamic_batch needs data.batch"),
        (_DataProto(_verl_batch(), {"uid": np.arange(2)}, {}), r"data.non_tensor_batch\['uid'\] .* \(3 rows, as data.batch\), got \(2,\)"),
        (_DataProto(_verl_batch(), {"uid": [1, 2, 3]}, {}), r"must be a NumPy array .* got list"),
        (_DataProto(_verl_batch(), ["uid"], {}), "data.non_tensor_batch must be a dict"),
        (_DataProto(_verl_batch(), {}, 7), "data.meta_info must be a dict"),
        (_DataProto(torch.ones(3, 4), {}, {}), r"batch must be a tensordict\.TensorDict"),
    ],
    ids=["batch-none", "no-batch", "short-array", "list-array", "non-tensor-list", "meta-int", "tensor-batch"],
)
def test_malformed_dataproto_is_a_plan_error_of_the_agreed_path(data, pattern, monkeypatch):
    """Issue 17.4: every malformed input of the adapter is a MicroBatchPlanError raised through
    the plan (which, in sync mode, agrees on it first), before any row is cut."""
    from seqbal import plan as plan_module
    from seqbal.integrations.verl import prepare_dynamic_batch

    from seqbal import rearrange as rearrange_module

    calls = []
    original = plan_module._plan
    counting = lambda *a, **k: calls.append(1) or original(*a, **k)  # noqa: E731
    monkeypatch.setattr(plan_module, "_plan", counting)
    monkeypatch.setattr(rearrange_module, "_plan", counting)
    with pytest.raises(MicroBatchPlanError, match=pattern) as info:
        prepare_dynamic_batch(data, 100)
    assert info.value.code == MicroBatchPlanError.BAD_BATCH
    assert calls, "the error did not go through the plan's agreement"


def test_count_rounded_to_the_divisor_is_not_a_whole_multiple_above_the_optimum():
    """Issue 17.10: 4 parts of 118 exist ([44, 44] and three triples); the count search's tries
    miss them, and rounding its 5 to the divisor gave 6."""
    lengths = [39, 42, 39, 42, 36, 39, 44, 40, 41, 44, 35]
    parts = plan_micro_batches(lengths, 118, num_batches_divided_by=2)
    assert len(parts) == 4
    assert_plan_invariants(lengths, parts, 118, num_batches_divided_by=2)
    assert len(plan_micro_batches([33, 18, 23, 24, 49, 30, 12, 11, 26], 59, num_batches_divided_by=2)) == 4


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=12), cap=st.integers(60, 130), divisor=st.integers(2, 3))
def test_divided_counts_stay_within_the_cap_and_reach_the_exact_optimum_on_few_items(lengths, cap, divisor):
    from tests.exact_packing import optimal_bin_count

    optimum = -(-optimal_bin_count(lengths, cap) // divisor) * divisor if len(lengths) <= 9 else None
    try:
        parts = plan_micro_batches(lengths, cap, num_batches_divided_by=divisor)
    except MicroBatchPlanError as error:
        assert "Cannot satisfy" in str(error) and (optimum is None or optimum > len(lengths))
        return
    assert_plan_invariants(lengths, parts, cap, num_batches_divided_by=divisor)
    if optimum is not None:
        assert len(parts) <= optimum + divisor  # never a whole multiple above what exists ...
        assert len(parts) == optimum  # ... and, on these few items, exactly the optimum
