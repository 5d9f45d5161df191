"""The divisor advice: what to say when the groups are too few for the rounded-up bin count.

The bin count is rounded **up** to a multiple of ``dp_size * num_batches_divided_by`` (and to
at least ``dp_size * min_num_micro_batch``), never down: a count below what the cap needs
cannot be repaired later, while a larger count is always reachable by splitting bins, and a
split never breaks the cap (each half holds less than the bin it came from). The price is a
few micro-batches fewer than full; the alternative, rounding down and overshooting the cap,
is an out-of-memory crash. When there are fewer groups than that count, the error names the
largest divisor that would fit (:func:`_largest_fitting_divisor`), in O(sqrt(groups / dp)).
"""

from __future__ import annotations

from typing import Optional


def _largest_fitting_divisor(floor: int, dp_size: int, divisor: int, num_groups: int) -> Optional[int]:
    """The largest ``d <= divisor`` with ``roundup_divisible(floor, dp_size * d) <= num_groups``, or
    None if none exists. O(sqrt(num_groups / dp_size)), whatever ``divisor`` is.

    With ``m = dp_size * d`` and ``q = ceildiv(floor, m)``, ``d`` fits exactly when some ``q``
    has ``q * m <= num_groups`` and ``q * m >= floor``. For a given ``q`` the largest ``d`` is
    ``min(divisor, num_groups // (q * dp_size))``, which never grows with ``q``: so the answer is
    that ``d`` for the smallest ``q`` where it fits. ``d`` takes one value over a run of ``q``,
    and ``q * m >= floor`` is easiest at the run's largest ``q``, so each run is tried once:
    ``O(sqrt(num_groups / dp_size))`` runs, instead of one try per divisor (hours at ``2**40``).
    """
    if floor > num_groups:
        return None  # every multiple of anything is at least floor
    q = max(1, num_groups // (dp_size * divisor))
    while True:
        d = min(divisor, num_groups // (q * dp_size))
        if d < 1:
            return None
        q = num_groups // (d * dp_size)  # the largest q that still allows this d
        if q * d * dp_size >= floor:
            return d
        q += 1


def _too_few_groups(
    needed: int,
    packed: int,
    num_groups: int,
    dp_size: int,
    max_token_len: int,
    divisor: Optional[int],
    min_num_micro_batch: Optional[int],
) -> ValueError:
    """The error for a bin count larger than the number of groups, with the settings to change."""
    advice = []
    if packed > num_groups // dp_size * dp_size:
        advice.append(f"raise max_token_len (the cap alone needs {packed} micro-batches)")
    if dp_size > num_groups:
        advice.append(f"use dp_size <= {num_groups}")
    per_rank = num_groups // dp_size
    if divisor is not None and divisor > 1:
        floor = max(packed, dp_size * (min_num_micro_batch or 1))
        fit = _largest_fitting_divisor(floor, dp_size, divisor, num_groups)
        if fit is not None and fit < divisor:
            advice.append(f"lower num_batches_divided_by to {fit}")
    if min_num_micro_batch is not None and dp_size * min_num_micro_batch > num_groups and per_rank >= 1:
        advice.append(f"lower min_num_micro_batch to {per_rank}")
    advice.append(f"or give the batch at least {needed} groups")
    return ValueError(
        f"Cannot satisfy max_token_len={max_token_len}: the schedule needs {needed} micro-batches "
        f"({needed // dp_size} per rank on dp_size={dp_size}: {packed} to respect the cap (best-fit packing), rounded up to a "
        f"multiple of dp_size * num_batches_divided_by = {dp_size * (divisor or 1)}"
        f"{f' and to at least dp_size * min_num_micro_batch = {dp_size * min_num_micro_batch}' if min_num_micro_batch else ''}"
        f"), but only {num_groups} group(s) of samples can fill them; " + "; ".join(advice)
    )
