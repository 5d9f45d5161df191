"""Pure partitioning algorithms: balancing, packing under a cap, splitting, capped balancing.

Everything here takes plain Python sequences or NumPy arrays of integers and returns index
lists; nothing here knows about TensorDict or torch.distributed, so it runs in CPU unit tests.

The central design decision is that the partitioner is *capacity-aware* and *monotone in the
count*. The older design ran Karmarkar-Karp (KK) on workloads at ``ceildiv(total, cap)`` and
added one micro-batch at a time while any micro-batch was over the cap: tens of full KK runs
on realistic data, and still more micro-batches than needed, because KK balances quadratic
workload, not tokens. Here the count comes first: it lies between a bin-packing lower bound
and the count of a cap-respecting packing, and counts in between are accepted as soon as
*some* partition into that many cap-respecting parts is found (an LPT start repaired by
moves and swaps). Then the partition is balanced once, at that count (KK on workloads where
it respects the cap, else the repaired partition or a cap-aware greedy), and rebalanced by
moves and swaps that never break the cap. Splitting a part never breaks the cap, so once a
partition into ``m`` parts is known, every count from ``m`` up to the number of items is
feasible: the data-parallel agreement can take the largest count any rank proposes and every
rank succeeds on the first pass. The price is a handful of O(n log n) passes per call instead
of one; the benefit is fewer micro-batches and no search loop of full repartitions.

One module per concern, in the order a call uses them:

- :mod:`.bounds`: the packing lower bound, where the count search starts;
- :mod:`.packing`: first fit, best-fit decreasing, the reserving fill, splitting bins;
- :mod:`.greedy`: the LPT balances (starts of the tries, the cap-aware fallback);
- :mod:`.bins`: the sorted part structures the local searches step on;
- :mod:`.local_search`: the repair of over-cap parts and the rebalance within the cap;
- :mod:`.feasibility`: one try at a count (starts, repaired);
- :mod:`.search`: the count search (:func:`smallest_feasible_partitions`);
- :mod:`.kk`: Karmarkar-Karp, item-level and chunked;
- :mod:`.balance`: the balance at the chosen count (:func:`capped_balanced_partitions`);
- :mod:`.exact`: a budgeted exact search on a few items (a count the tries miss, under a divisor);
- :mod:`.windows`: the padded cost of micro-batches trimmed to their padding window;
- :mod:`.sample_cap`: the second cap, at most ``max_samples`` samples per part, kept around the above;
- :mod:`.parts`: part sums and labels, ``ceildiv``; input checks live in :mod:`seqbal.validation`.
"""

from __future__ import annotations

from ..validation import INT64_SAFE_TOTAL, IntSequence, check_int64_sums
from .balance import capped_balanced_partitions
from .bounds import packing_lower_bound
from .kk import get_seqlen_balanced_partitions, karmarkar_karp
from .local_search import rebalance_within_capacity, repair_over_capacity
from .packing import best_fit_decreasing_partitions, first_fit_partitions, split_bins_to_count
from .parts import ceildiv, partition_sums, roundup_divisible
from .search import smallest_feasible_partitions

__all__ = [
    "ceildiv",
    "roundup_divisible",
    "karmarkar_karp",
    "get_seqlen_balanced_partitions",
    "packing_lower_bound",
    "first_fit_partitions",
    "best_fit_decreasing_partitions",
    "split_bins_to_count",
    "repair_over_capacity",
    "rebalance_within_capacity",
    "capped_balanced_partitions",
    "smallest_feasible_partitions",
    "partition_sums",
]
