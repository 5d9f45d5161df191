"""``seqbal plan``: see what seqbal will do with your lengths before you launch a run.

The command reads a length distribution (a text file, ``.npy``, ``.jsonl``, ``.parquet``, ``-``
for standard input, or the real rollout sample shipped in ``seqbal/data``), splits it over
simulated data-parallel ranks the way the trainer would (``--route``: verl's driver-side
``balance_batch`` by default, contiguous chunks, or seqbal's global ``build_dp_schedule``), and
applies the decision the ranks would make together. It leads with what changes for the user
against what they run today, named by verl version: planning time, micro-batch count, the
largest micro-batch against the cap, and what happens on an impossible input; then the per-rank
figures.

The package is split by concern, each module with its own reasoning:

* :mod:`.lengths`: reading the lengths (files, standard input, the shipped sample).
* :mod:`.ranks`: the simulated data-parallel ranks and their per-rank figures.
* :mod:`.compare`: the comparison with verl (verl's own code, or a re-implementation).
* :mod:`.verl_run`: running verl's own ``rearrange_micro_batches`` on simulated ranks.
* :mod:`.kk_loop`: verl's loop re-implemented, for where verl is not installed.
* :mod:`.report`: the report, as text or JSON.
* :mod:`.plot`: the report's figure (``--plot``).
* :mod:`.command`: the parser and :func:`main`, the ``seqbal`` console entry point.
"""

from __future__ import annotations

from .lengths import DEFAULT_SAMPLE, read_lengths
from .command import ERROR_PREFIX, main
from .compare import COMPARE_AUTO_MAX_KK_SETS, _OneTorchThread, kk_sets_per_pass
from .plot import plot_figure
from .ranks import packing_bound, simulate_ranks, split_over_ranks
from .report import IMPOSSIBLE_INPUT, build_report, format_report, format_table

__all__ = ["main", "read_lengths", "split_over_ranks", "simulate_ranks", "DEFAULT_SAMPLE", "COMPARE_AUTO_MAX_KK_SETS"]
