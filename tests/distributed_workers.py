"""Rank-side half of the distributed tests: the scenarios and the process that runs them.

Starting a process that imports torch costs seconds on a small machine, so each world size is
spawned once and its ranks run every scenario in sequence, each scenario on a fresh process
group with a short timeout. A rank records one JSON line per scenario (outcome, plan, how many
collectives it called, how long the call took) and the test process makes every assertion.

The parent reads this module too: :func:`build_scenarios` is deterministic, so the parent knows
each rank's lengths and expectations without receiving them.

Nothing here asserts; a rank that is wrong must still take part in the next collective, or it
would turn a wrong answer into a hang.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Optional

import numpy as np

from seqbal.cost import CostModel, MemoryCost

CAP = 4096
# Timeout of the process group every scenario runs in. A correct call never waits on a peer for
# more than milliseconds; a rank left behind in a collective fails after this long. The tests
# read "took more than half of it" as "waited in a collective", so it is set far above what a
# loaded 2-core CI machine needs for one call (several seconds were seen with 4 ranks there).
SCENARIO_TIMEOUT_S = 30.0
# Timeout of the group the hang self-test deliberately leaves one rank waiting in.
HANG_TIMEOUT_S = 1.0
# Longest a rank waits for its peers to finish a scenario (a peer may be waiting out a timeout).
RESYNC_TIMEOUT_S = 3 * SCENARIO_TIMEOUT_S
# Rendezvous of the ranks (they may start seconds apart when the machine is busy).
INIT_TIMEOUT_S = 60.0

# torch.distributed functions that count as "some other collective" when wrapped.
OTHER_COLLECTIVES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "monitored_barrier",
)


@dataclass
class Scenario:
    """One call of seqbal on every rank, and what the test expects of it.

    Attributes:
        name: unique name (also the order key of the results).
        lengths: effective lengths of each (global) rank's batch.
        kwargs: keyword arguments of the call on every rank (``max_token_len`` included).
        rank_kwargs: per-rank overrides of ``kwargs`` (a bad argument on one rank).
        group: "world" (a fresh group of all ranks), "WORLD" (``dist.group.WORLD``), "none"
            (``dp_group=None``), "single" (a group of this rank only), "pairs" (ranks 2i and
            2i+1 form a group).
        api: "plan" (``plan_micro_batches``), "dense" (``rearrange_micro_batches`` on an
            attention mask), "jagged" (nested ``input_ids``); on ``bad_ranks`` only (the
            others get "dense"): "no_mask" (a batch without lengths), "unbatched" (a
            TensorDict with ``batch_size=[]``: it plans but cannot be indexed), "half_mask"
            (an attention mask holding 0.5). "verl": the verl adapter's ``prepare_dynamic_batch``
            on a DataProto-like object; on ``bad_ranks`` only (the others get "verl"):
            "verl_no_batch" (``data.batch`` is None), "verl_short_non_tensor" (a
            ``non_tensor_batch`` array one row short).
        synced: the call is in sync mode (two all-reduces expected, else none).
        bad_ranks: {rank: substrings its own message must hold}; empty for a good scenario.
        cannot_satisfy: every rank's message must start with "Cannot satisfy max_token_len".
        all_raise: every rank raises the very same ValueError, holding each of these
            substrings (an error only the agreement can see, e.g. mismatched arguments).
        named_rank: the group-local rank every other rank's message must name (default: the
            single bad rank, if there is one).
        hook: "second_pass" (rank 0's first partition fails, forcing a second pass of the
            within-limit loop), "partition_raises" (rank 0's partitioner raises after the
            first all-reduce) or "hang" (rank 1 skips the call: the harness must report it).
    """

    name: str
    lengths: list[list[int]]
    kwargs: dict[str, Any]
    rank_kwargs: dict[int, dict[str, Any]] = field(default_factory=dict)
    group: str = "world"
    api: str = "plan"
    synced: bool = True
    bad_ranks: dict[int, list[str]] = field(default_factory=dict)
    cannot_satisfy: bool = False
    named_rank: Optional[int] = None
    hook: Optional[str] = None
    all_raise: list[str] = field(default_factory=list)

    @property
    def expect_error(self) -> bool:
        return bool(self.bad_ranks) or self.cannot_satisfy or bool(self.all_raise)

    def call_kwargs(self, rank: int) -> dict[str, Any]:
        merged = dict(self.kwargs)
        merged.update(self.rank_kwargs.get(rank, {}))
        return merged

    def group_of(self, rank: int, world: int) -> list[int]:
        """Global ranks that must agree with ``rank`` (itself only when not syncing)."""
        if self.group in ("world", "WORLD") and self.synced:
            return list(range(world))
        if self.group == "pairs":
            return [rank - rank % 2, rank - rank % 2 + 1]
        return [rank]


# ---------------------------------------------------------------------------------------------
# Data: each rank its own batch size and length distribution
# ---------------------------------------------------------------------------------------------


def rank_lengths(rank: int, seed: int, cap: int = CAP) -> list[int]:
    """A batch whose size and length distribution depend on the rank.

    0: 24 short uniform samples; 1: 40 long-tailed (log-normal) samples; 2: 16 long samples
    (a third of the cap and up); 3: 64 tiny samples including empty ones. Every sample fits in
    ``cap``; the ranks' own counts differ, so most ranks must go above their own proposal.
    """
    rng = np.random.default_rng(1000 * seed + rank)
    kind = rank % 4
    if kind == 0:
        lengths = rng.integers(1, cap // 4, size=24)
    elif kind == 1:
        lengths = np.minimum(rng.lognormal(6.0, 1.2, size=40).astype(np.int64) + 1, cap)
    elif kind == 2:
        lengths = rng.integers(cap // 3, cap + 1, size=16)
    else:
        lengths = rng.integers(0, 200, size=64)
    return [int(x) for x in lengths]


def build_scenarios(world: int) -> list[Scenario]:
    """Every scenario a world of ``world`` ranks runs, in order."""
    ranks = range(world)
    base = [rank_lengths(r, seed=1) for r in ranks]
    other = [rank_lengths(r, seed=2) for r in ranks]
    last = world - 1
    out: list[Scenario] = []
    add = out.append

    # --- good data: equal counts, cap, every sample once, round trips ---------------------
    add(Scenario("plan_mixed", base, {"max_token_len": CAP}))
    add(Scenario("plan_WORLD", other, {"max_token_len": CAP}, group="WORLD"))
    add(Scenario("plan_no_balance", base, {"max_token_len": CAP, "use_dynamic_bsz_balance": False}))
    add(Scenario("plan_divided_by_3", other, {"max_token_len": CAP, "num_batches_divided_by": 3}))
    add(Scenario("plan_min_count", base, {"max_token_len": CAP, "min_num_micro_batch": 5}))
    # a rank with one huge batch forces a large count on ranks that would need one micro-batch
    skewed = [[10] * 30 for _ in ranks]
    skewed[last] = [CAP] * 9
    add(Scenario("plan_skewed", skewed, {"max_token_len": CAP}))
    # rank r needs 5 + r micro-batches of <= 8 tokens (4 + r sevens, ten ones)
    add(Scenario("plan_tight_cap", [[7] * (4 + r) + [1] * 10 for r in ranks], {"max_token_len": 8}))
    halves = [[x // 2 for x in rank_lengths(r, seed=3)] for r in ranks]  # pairs fit in the cap
    even = [x[: 2 * (len(x) // 2)] for x in halves]
    add(Scenario("plan_forced_groups", even, {"max_token_len": CAP, "force_group_size": 2}))
    add(Scenario("dense_mixed", base, {"max_token_len": CAP}, api="dense"))
    add(Scenario("dense_divided_by_2", other, {"max_token_len": CAP, "num_batches_divided_by": 2}, api="dense"))
    add(Scenario("jagged_mixed", other, {"max_token_len": CAP}, api="jagged"))
    # every cost model keeps the cap and the equal count (rank lengths differ, so counts differ locally)
    add(Scenario("plan_padded", base, {"max_token_len": CAP, "cost_model": "padded"}))
    quarters = [[x // 2 for x in rank] for rank in even]  # padded pairs leave room for several per micro-batch
    add(Scenario("plan_padded_groups", quarters, {"max_token_len": CAP, "cost_model": "padded", "force_group_size": 2}))
    add(Scenario("plan_rounded_packed", other,
                 {"max_token_len": CAP, "cost_model": CostModel(round_to=8, pack_round_to=16)}))
    add(Scenario("dense_padded", base, {"max_token_len": CAP, "cost_model": "padded"}, api="dense"))

    # the sample cap, not the tokens, sets each rank's count (ceildiv(12 + 6r, 3)); the agreed
    # count is the largest, and every rank keeps at most 3 samples per micro-batch
    add(Scenario("plan_sample_cap", [[10] * (12 + 6 * r) for r in ranks],
                 {"max_token_len": CAP, "max_samples_per_micro_batch": 3}))
    add(Scenario("plan_sample_cap_groups", [[10] * (16 + 4 * r) for r in ranks],
                 {"max_token_len": CAP, "max_samples_per_micro_batch": 5, "force_group_size": 2}))

    # --- no sync: no collective at all ----------------------------------------------------
    add(Scenario("nosync_flag", base, {"max_token_len": CAP, "same_micro_num_in_dp": False}, synced=False))
    add(Scenario("nosync_no_group", base, {"max_token_len": CAP}, group="none", synced=False))
    add(Scenario("nosync_dense", other, {"max_token_len": CAP}, group="none", api="dense", synced=False))
    # sync with a one-rank group must equal no sync (compared in the parent)
    for suffix, kwargs in (("", {}), ("_divided", {"num_batches_divided_by": 2, "min_num_micro_batch": 3})):
        add(Scenario("single_sync" + suffix, base, {"max_token_len": CAP, **kwargs}, group="single"))
        add(Scenario("single_nosync" + suffix, base, {"max_token_len": CAP, **kwargs}, group="none", synced=False))

    # --- one rank with bad data, the others fine: every rank raises ValueError -------------
    def with_bad(lengths: list[int], rank: int = last) -> list[list[int]]:
        data = [list(x) for x in base]
        data[rank] = lengths
        return data

    over = list(base[last])
    over[3] = CAP + 1
    add(Scenario("err_sample_over_cap", with_bad(over), {"max_token_len": CAP},
                 bad_ranks={last: ["exceeds max_token_len", "sample 3", str(CAP + 1)]}))
    add(Scenario("err_sample_over_cap_dense", with_bad(over), {"max_token_len": CAP}, api="dense",
                 bad_ranks={last: ["exceeds max_token_len", "sample 3", str(CAP + 1)]}))
    add(Scenario("err_sample_over_cap_rank0", with_bad([5, CAP + 7, 5], rank=0), {"max_token_len": CAP},
                 bad_ranks={0: ["exceeds max_token_len", "sample 1", str(CAP + 7)]}))
    paired = [[100] * (6 + 2 * r) for r in ranks]
    paired[last] = [100, 100, CAP - 10, 20, 100, 100]
    add(Scenario("err_forced_group_over_cap", paired, {"max_token_len": CAP, "force_group_size": 2},
                 bad_ranks={last: ["forced group exceeds max_token_len", "group 1", str(CAP + 10)]}))
    # the others need 9 micro-batches each; the last rank has only 2 samples
    few = [[CAP] * 9 for _ in ranks]
    few[last] = [1, 1]
    add(Scenario("err_cannot_satisfy_agreed", few, {"max_token_len": CAP}, cannot_satisfy=True, named_rank=last))
    add(Scenario("err_cannot_satisfy_agreed_dense", few, {"max_token_len": CAP}, api="dense",
                 cannot_satisfy=True, named_rank=last))
    # min_num_micro_batch above this rank's sample count: the rank finds it before agreeing
    local = [list(x) for x in base]
    local[last] = [1, 2, 3]
    add(Scenario("err_cannot_satisfy_local", local, {"max_token_len": CAP, "min_num_micro_batch": 4},
                 bad_ranks={last: ["Cannot satisfy max_token_len"]}, cannot_satisfy=True))
    add(Scenario("err_empty_batch", with_bad([]), {"max_token_len": CAP}, bad_ranks={last: ["empty"]}))
    add(Scenario("err_empty_batch_dense", with_bad([]), {"max_token_len": CAP}, api="dense",
                 bad_ranks={last: ["empty"]}))
    add(Scenario("err_negative_length", with_bad([5, -2, 5]), {"max_token_len": CAP},
                 bad_ranks={last: ["negative", "-2"]}))
    for label, bad in (("zero", 0), ("negative", -8), ("float", 4096.0), ("none", None), ("str", "4096")):
        add(Scenario(f"err_bad_max_token_len_{label}", base, {"max_token_len": CAP},
                     rank_kwargs={last: {"max_token_len": bad}}, bad_ranks={last: ["max_token_len", repr(bad)]}))
    add(Scenario("err_bad_force_group_size", base, {"max_token_len": CAP},
                 rank_kwargs={last: {"force_group_size": 0}}, bad_ranks={last: ["force_group_size"]}))
    add(Scenario("err_no_lengths_in_batch", base, {"max_token_len": CAP}, api="no_mask",
                 bad_ranks={last: ["attention_mask"]}))
    add(Scenario("err_unindexable_batch", base, {"max_token_len": CAP}, api="unbatched",
                 bad_ranks={last: ["batch must have a batch dimension", "batch_size []"]}))
    add(Scenario("err_mask_of_halves", base, {"max_token_len": CAP}, api="half_mask",
                 bad_ranks={last: ["attention_mask must be bool or hold only 0 and 1", "got 0.5"]}))

    # a forced group larger than the sample cap, and a sample cap that is no count, on one rank
    add(Scenario("err_group_over_sample_cap", even, {"max_token_len": CAP, "force_group_size": 2,
                                                      "max_samples_per_micro_batch": 1},
                 bad_ranks={r: ["forced group of 2 samples exceeds max_samples_per_micro_batch=1"] for r in ranks}))
    add(Scenario("err_sample_cap_zero", base, {"max_token_len": CAP}, rank_kwargs={last: {"max_samples_per_micro_batch": 0}},
                 bad_ranks={last: ["max_samples_per_micro_batch must be None or a positive int", "got 0"]}))

    # --- arguments that must match differ between ranks: the same ValueError everywhere ----
    mismatch = "passed different arguments that must be identical on every rank"
    # divisors 2 and 3 on [5] * 12 used to give counts 4 and 3 without an error
    add(Scenario("err_mismatch_divisor", [[5] * 12 for _ in ranks], {"max_token_len": 100, "num_batches_divided_by": 2},
                 rank_kwargs={last: {"num_batches_divided_by": 3}},
                 all_raise=[mismatch, "num_batches_divided_by from 2 to 3"]))
    # ... and this one left the last rank waiting in the second all-reduce
    lopsided = [[30] * 12 for _ in ranks]
    lopsided[last] = [90] * 7
    add(Scenario("err_mismatch_divisor_hang", lopsided, {"max_token_len": 100, "num_batches_divided_by": 2},
                 rank_kwargs={last: {"num_batches_divided_by": 7}},
                 all_raise=[mismatch, "num_batches_divided_by from 2 to 7"]))
    add(Scenario("err_mismatch_divisor_none", base, {"max_token_len": CAP},
                 rank_kwargs={0: {"num_batches_divided_by": 2}},
                 all_raise=[mismatch, "num_batches_divided_by from 1 to 2 (None counts as 1)"]))
    add(Scenario("err_mismatch_cost_model", base, {"max_token_len": CAP},
                 rank_kwargs={last: {"cost_model": "padded"}},
                 all_raise=[mismatch, "cost_model.padded from 0 to 1"]))
    # a calibrated memory cost: the same budget, another rank's coefficients (another calibration)
    memory = {"max_token_len": 10 ** 9, "cost_model": CostModel(memory=MemoryCost(fixed=10 ** 6, per_token=1000.0))}
    add(Scenario("err_mismatch_memory_cost", base, memory,
                 rank_kwargs={last: {"cost_model": CostModel(memory=MemoryCost(fixed=10 ** 6, per_token=1500.0))}},
                 all_raise=[mismatch, "cost_model.memory.per_token from 1000 to 1500"]))
    add(Scenario("plan_memory_cost", base, memory, api="dense"))
    add(Scenario("err_mismatch_sample_cap", base, {"max_token_len": CAP, "max_samples_per_micro_batch": 4},
                 rank_kwargs={last: {"max_samples_per_micro_batch": None}},
                 all_raise=[mismatch, "max_samples_per_micro_batch from 0 to 4"]))
    add(Scenario("err_mismatch_cap", base, {"max_token_len": CAP}, rank_kwargs={last: {"max_token_len": 2 * CAP}},
                 all_raise=[mismatch, f"max_token_len from {CAP} to {2 * CAP}"]))
    add(Scenario("err_mismatch_group_size", even, {"max_token_len": CAP, "force_group_size": 2},
                 rank_kwargs={0: {"force_group_size": 1}}, all_raise=[mismatch, "force_group_size from 1 to 2"]))
    # the mismatch is reported even when it also makes a rank's data fail (here: over its cap)
    add(Scenario("err_mismatch_cap_and_over_cap", [[3000] * 4 for _ in ranks], {"max_token_len": CAP},
                 rank_kwargs={last: {"max_token_len": 2000}}, all_raise=[mismatch, f"max_token_len from 2000 to {CAP}"]))
    # min_num_micro_batch may differ: every rank gets the largest minimum
    add(Scenario("plan_min_differs", base, {"max_token_len": CAP, "min_num_micro_batch": 2},
                 rank_kwargs={last: {"min_num_micro_batch": 11}}, api="dense"))
    # NumPy scalars (unsigned included) are plain ints by the time they are packed
    add(Scenario("plan_numpy_arguments", other, {"max_token_len": np.int16(CAP), "num_batches_divided_by": np.uint32(2),
                                                 "min_num_micro_batch": np.uint64(3)}))

    # --- issue 17: what one rank used to raise before (or without) the agreement ------------
    # round_to beyond int64 overflowed while packing the first all-reduce: the peers hung in it
    for field_name in ("round_to", "pack_round_to"):
        add(Scenario(f"err_hang_{field_name}", base, {"max_token_len": CAP},
                     rank_kwargs={last: {"cost_model": CostModel(**{field_name: 2**64})}},
                     bad_ranks={last: [f"cost_model.{field_name}=18446744073709551616 is too large"]}))
    # the verl adapter raised on data.batch None before the agreement: the peers hung
    add(Scenario("err_hang_verl_no_batch", base, {"max_token_len": CAP}, api="verl_no_batch",
                 bad_ranks={last: ["prepare_dynamic_batch needs data.batch", "got None"]}))
    # ... and with dummy micro-batches asked on every rank, the failing rank must still report
    # its own problem, not a false "different arguments" (it once planned its report without them)
    add(Scenario("err_verl_no_batch_with_dummies", base, {"max_token_len": CAP, "dummy_micro_batches": True},
                 api="verl_no_batch", bad_ranks={last: ["prepare_dynamic_batch needs data.batch", "got None"]}))
    # ... and a non_tensor_batch array one row short failed after the plan on that rank alone
    add(Scenario("err_verl_short_non_tensor", base, {"max_token_len": CAP}, api="verl_short_non_tensor",
                 bad_ranks={last: ["data.non_tensor_batch['uid']", f"{len(base[last])} rows"]}))
    add(Scenario("verl_mixed", base, {"max_token_len": CAP}, api="verl"))
    # a sync flag that bool() cannot read raised RuntimeError before the agreement: the peers hung
    add(Scenario("err_hang_sync_flag", base, {"max_token_len": CAP},
                 rank_kwargs={last: {"same_micro_num_in_dp": _two_element_tensor()}},
                 bad_ranks={last: ["same_micro_num_in_dp must be True or False", "shape (2,)"]}))
    # ... and the ordering flag raised RuntimeError after both all-reduces, on that rank alone
    add(Scenario("err_balance_flag", base, {"max_token_len": CAP},
                 rank_kwargs={last: {"use_dynamic_bsz_balance": _two_element_tensor()}},
                 bad_ranks={last: ["use_dynamic_bsz_balance must be True or False", "shape (2,)"]}))
    # each rank its own message, every rank the agreed (largest) code: here SAMPLE_EXCEEDS (3)
    codes = [list(x) for x in base]
    codes[0] = [1, 2, 3]
    codes[last] = [5, CAP + 1]
    add(Scenario("err_codes_agree", codes, {"max_token_len": CAP},
                 rank_kwargs={0: {"min_num_micro_batch": 4}, last: {"min_num_micro_batch": 4}},
                 bad_ranks={0: ["Cannot satisfy max_token_len"], last: ["exceeds max_token_len", str(CAP + 1)]}))

    if world > 2:
        two_bad = [list(x) for x in base]
        two_bad[1] = []
        two_bad[2] = [CAP + 3]
        add(Scenario("err_two_ranks_differ", two_bad, {"max_token_len": CAP},
                     bad_ranks={1: ["empty"], 2: ["exceeds max_token_len", str(CAP + 3)]}))

    # --- subgroups: ranks (0, 1), (2, 3), ... each agree on their own count ----------------
    if world >= 4:
        sub = [[CAP] * 3, [5] * 10, [CAP] * 8, [5] * 10]
        add(Scenario("pairs_own_count", sub, {"max_token_len": CAP}, group="pairs"))
        add(Scenario("pairs_mixed", base, {"max_token_len": CAP}, group="pairs", api="dense"))
        add(Scenario("pairs_error_in_one_pair", with_bad([]), {"max_token_len": CAP}, group="pairs",
                     bad_ranks={last: ["empty"]}, named_rank=1))

    # --- the detectors themselves --------------------------------------------------------
    add(Scenario("detector_second_pass", base, {"max_token_len": CAP}, hook="second_pass"))
    add(Scenario("fault_partition_raises", base, {"max_token_len": CAP}, hook="partition_raises"))
    add(Scenario("detector_hang", base, {"max_token_len": CAP}, hook="hang"))
    names = [s.name for s in out]
    if len(names) != len(set(names)):
        raise ValueError(f"duplicate scenario names: {names}")
    return out


def _two_element_tensor() -> Any:
    import torch

    return torch.tensor([1, 0])


# ---------------------------------------------------------------------------------------------
# Rank side
# ---------------------------------------------------------------------------------------------


class FakeDataProto:
    """What the verl adapter needs of verl's ``DataProto`` (verl itself is not imported here)."""

    def __init__(self, batch=None, non_tensor_batch=None, meta_info=None) -> None:
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch if non_tensor_batch is not None else {}
        self.meta_info = meta_info if meta_info is not None else {}

    def __len__(self) -> int:
        return int(self.batch.batch_size[0])


def _make_batch(lengths: list[int], api: str, seed: int):
    """A TensorDict whose effective lengths are ``lengths`` (mask ones placed at random)."""
    import torch
    from tensordict import TensorDict

    n = len(lengths)
    width = max(lengths, default=0) + 3
    gen = torch.Generator().manual_seed(seed)
    sample_id = torch.arange(n, dtype=torch.long)
    if api == "jagged":
        rows = [torch.randint(0, 1000, (length,), generator=gen) for length in lengths]
        input_ids = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
        return TensorDict({"input_ids": input_ids, "sample_id": sample_id}, batch_size=[n])
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, length in enumerate(lengths):
        start = int(torch.randint(0, width - length + 1, (1,), generator=gen))
        mask[i, start : start + length] = 1
    data = {
        "input_ids": torch.randint(0, 1000, (n, width), generator=gen) * mask,
        "sample_id": sample_id,
        "position_ids": torch.cumsum(mask, -1),
    }
    if api == "half_mask":
        mask = mask * 0.5
    if api != "no_mask":
        data["attention_mask"] = mask
    return TensorDict(data, batch_size=[] if api == "unbatched" else [n])


def _roundtrip(batch, micro_batches, indices, api: str) -> dict[str, Any]:
    """What the parent needs to check that micro-batches hold their indices and restore exactly."""
    import torch

    from seqbal import restore_dynamic_batch

    info: dict[str, Any] = {"mb_ids": [mb["sample_id"].tolist() for mb in micro_batches]}
    if api == "jagged":
        info["mb_tokens"] = [int(mb["input_ids"].offsets().diff().sum()) for mb in micro_batches]
        rows = [row for mb in micro_batches for row in mb["input_ids"].unbind()]
        output = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
        restored = restore_dynamic_batch(output, indices).unbind()
        original = batch["input_ids"].unbind()
        info["restored_exact"] = len(restored) == len(original) and all(
            torch.equal(a, b) for a, b in zip(restored, original)
        )
    else:
        info["mb_tokens"] = [int(mb["attention_mask"].sum()) for mb in micro_batches]
        restored = restore_dynamic_batch(torch.cat(micro_batches), indices)
        info["restored_exact"] = set(restored.keys()) == set(batch.keys()) and all(
            torch.equal(restored[key], batch[key]) for key in batch.keys()
        )
    concat_ids = torch.cat([mb["sample_id"] for mb in micro_batches])
    info["restored_ids"] = restore_dynamic_batch(concat_ids, indices).tolist()
    return info


class _CollectiveCounter:
    """Wraps torch.distributed's collectives in this process and counts the calls."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.all_reduce = 0
        self.other: list[str] = []
        self.devices: list[str] = []
        original_all_reduce = dist.all_reduce

        def counting_all_reduce(tensor, *args, **kwargs):
            self.all_reduce += 1
            self.devices.append(tensor.device.type)
            return original_all_reduce(tensor, *args, **kwargs)

        dist.all_reduce = counting_all_reduce
        for name in OTHER_COLLECTIVES:
            original = getattr(dist, name, None)
            if original is not None:
                setattr(dist, name, self._counting_other(name, original))

    def _counting_other(self, name, original):
        def counting(*args, **kwargs):
            self.other.append(name)
            return original(*args, **kwargs)

        return counting

    def reset(self) -> None:
        self.all_reduce = 0
        self.other = []
        self.devices = []


def _scenario_group(kind: str, world: int, backend: str, timeout_s: float) -> Any:
    """A fresh group of ``kind`` for one scenario ("world", "single", "pairs"; None for the
    others). Every rank creates every group of the kind, as ``new_group`` requires."""
    import torch.distributed as dist

    members = {
        "world": [list(range(world))],
        "single": [[r] for r in range(world)],
        "pairs": [[first, first + 1] for first in range(0, world, 2)],
    }.get(kind)
    if members is None:
        return dist.group.WORLD if kind == "WORLD" else None
    mine = None
    for ranks in members:
        group = dist.new_group(ranks, timeout=timedelta(seconds=timeout_s), backend=backend)
        if dist.get_rank() in ranks:
            mine = group
    if backend == "nccl":
        _warm_up(mine)
    return mine


def _warm_up(group: Any) -> None:
    """NCCL builds a communicator on a group's first collective (seconds): do that outside the
    timed and counted call."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.zeros(1, device="cuda"), group=group)
    torch.cuda.synchronize()


def _run_one(scenario: Scenario, rank: int, group: Any, counter: _CollectiveCounter) -> dict[str, Any]:
    import seqbal
    from seqbal import plan as plan_module

    kwargs = scenario.call_kwargs(rank)
    lengths = scenario.lengths[rank]
    api = scenario.api
    if api in ("no_mask", "unbatched", "half_mask") and rank not in scenario.bad_ranks:
        api = "dense"
    if api.startswith("verl_") and rank not in scenario.bad_ranks:
        api = "verl"
    batch = None if api == "plan" else _make_batch(lengths, api, seed=rank)

    restore = None
    if scenario.hook in ("second_pass", "partition_raises") and rank == 0:
        original = plan_module._LocalPlan.partition_at
        state = {"failed": False}

        def failing_once(self, count):
            if not state["failed"]:
                state["failed"] = True
                if scenario.hook == "partition_raises":
                    raise RuntimeError("injected partitioner bug")
                return None
            return original(self, count)

        plan_module._LocalPlan.partition_at = failing_once
        restore = lambda: setattr(plan_module._LocalPlan, "partition_at", original)  # noqa: E731

    record: dict[str, Any] = {"name": scenario.name, "rank": rank}
    counter.reset()
    started = time.monotonic()
    try:
        if scenario.hook == "hang" and rank == 1:
            # this rank never joins; it stays alive so that its peers meet the group's timeout
            # (not a closed socket), which is what a rank stuck elsewhere looks like
            time.sleep(HANG_TIMEOUT_S * 1.5)
            parts = None
            record["skipped_call"] = True
        elif api == "plan":
            parts = seqbal.plan_micro_batches(lengths, dp_group=group, **kwargs)
        elif api.startswith("verl"):
            from seqbal.integrations.verl import prepare_dynamic_batch

            rows = len(lengths) - (api == "verl_short_non_tensor")
            data = FakeDataProto(
                batch=None if api == "verl_no_batch" else batch,
                non_tensor_batch={"uid": np.arange(rows)},
                meta_info={"step": 1},
            )
            micro_batches, parts = prepare_dynamic_batch(data, dp_group=group, **kwargs)
            record.update(_roundtrip(batch, [mb.batch for mb in micro_batches], parts, "dense"))
            uids = [mb.non_tensor_batch["uid"].tolist() for mb in micro_batches]
            record["non_tensor_exact"] = uids == [list(part) for part in parts]
        else:
            micro_batches, parts = seqbal.rearrange_micro_batches(batch, dp_group=group, **kwargs)
            record.update(_roundtrip(batch, micro_batches, parts, api))
        record["outcome"] = "ok"
        record["parts"] = parts
    except Exception as error:  # noqa: BLE001 - every outcome is data for the parent
        record["outcome"] = "error"
        record["error_type"] = type(error).__name__
        record["is_value_error"] = isinstance(error, ValueError)
        record["error_code"] = getattr(error, "code", None)
        record["message"] = str(error)
        record["traceback"] = traceback.format_exc(limit=6)
    finally:
        if restore is not None:
            restore()
    record["elapsed_s"] = time.monotonic() - started
    record["all_reduce_calls"] = counter.all_reduce
    record["other_collectives"] = list(counter.other)
    record["collective_devices"] = list(counter.devices)
    return record


def meet_again(store: Any, tag: str, rank: int, world: int) -> None:
    """Meet the other ranks outside of torch.distributed after a scenario, so that one that
    leaves them out of step (one raised early, its peers timed out) fails alone instead of
    breaking every scenario after it."""
    keys = [f"{tag}/{r}" for r in range(world)]
    store.set(keys[rank], "done")
    store.wait(keys, timedelta(seconds=RESYNC_TIMEOUT_S))


def serve_scenarios(rank: int, world: int, backend: str, store_port: int, out_dir: str, run: Any) -> None:
    """The life of one spawned rank: join the store and the default group, open the rank's log,
    call ``run(store, write)`` (which runs the scenarios, writing one record each), then record
    ``__done__`` (or ``__crash__`` with the traceback) and exit."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    started = time.monotonic()
    log_path = os.path.join(out_dir, f"rank{rank}.jsonl")
    with open(log_path, "w", encoding="utf-8") as log:

        def write(record: dict[str, Any]) -> None:
            record["since_start_s"] = time.monotonic() - started
            log.write(json.dumps(record) + "\n")
            log.flush()

        try:
            if backend == "nccl":
                torch.cuda.set_device(rank)  # the parent only runs NCCL worlds with a GPU per rank
            store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=INIT_TIMEOUT_S))
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=INIT_TIMEOUT_S)
            )
            if backend == "nccl":
                _warm_up(dist.group.WORLD)
            # seqbal loads its TensorDict half lazily, on the first rearrange call: load it here,
            # or that import (about a second on a busy machine) lands inside a timed scenario
            # and reads as a rank waiting on its peers.
            import seqbal.rearrange  # noqa: F401

            run(store, write)
            write({"name": "__done__", "rank": rank})
        except Exception:  # noqa: BLE001 - the parent reports it
            write({"name": "__crash__", "rank": rank, "traceback": traceback.format_exc()})
            raise
    # no destroy_process_group: after the hang self-test a peer may still hold a dead group, and
    # tearing it down could block; the process exits and the OS closes the sockets.
    os._exit(0)


def worker_main(rank: int, world: int, backend: str, store_port: int, out_dir: str) -> None:
    """Entry point of one spawned rank: join the store, run every scenario, log each result."""
    entered = time.time()

    def run(store: Any, write: Any) -> None:
        counter = _CollectiveCounter()
        write({"name": "__ready__", "rank": rank, "startup_s": time.time() - entered})
        for scenario in build_scenarios(world):
            if scenario.hook == "hang" and backend != "gloo":
                continue  # NCCL's watchdog aborts the process instead; gloo proves the harness
            timeout = HANG_TIMEOUT_S if scenario.hook == "hang" else SCENARIO_TIMEOUT_S
            group = _scenario_group(scenario.group, world, backend, timeout)
            write(_run_one(scenario, rank, group, counter))
            meet_again(store, f"seqbal-test/{scenario.name}", rank, world)

    serve_scenarios(rank, world, backend, store_port, out_dir, run)


def sleep_forever(rank: int) -> None:
    """A rank that never returns, for the test of the parent's deadline (no torch import)."""
    while True:
        time.sleep(60)
