"""The comparison with verl: verl's own code where verl is installed, else a re-implementation.

The verl side is verl's own code where verl is installed (:mod:`seqbal.cli.verl_run`: verl 0.9.1's
``rearrange_micro_batches``, one thread per simulated rank, its all-reduces served in-process),
else a re-implementation that does verl's work (:mod:`seqbal.cli.kk_loop`); the report says which
ran. A faster stand-in would make seqbal look slower than it is against the verl users run.

verl's Karmarkar-Karp builds ``k`` set objects per sample per pass (``k`` the micro-batch
count), so the comparison grows as samples x micro-batches and takes minutes on large inputs:
by default it runs only up to :data:`COMPARE_AUTO_MAX_KK_SETS` of them; ``--compare on|off``
overrides the rule. A comparison that cannot run on an input (verl's own code fails on it) is
skipped with a one-line note; it never takes seqbal's plan down. Every run shows its phases on
standard error (:class:`Progress`), never on standard output.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any, Optional, Sequence

import numpy as np

from .verl_run import VerlCode, load_verl, one_pass_0_8, reimplemented_strict_loop, verl_strict_loop
from ..partition import ceildiv
from .ranks import RankSplit, _rank_rows


#: ``--compare auto`` compares with verl and the other routes while verl's KK builds at most this
#: many set objects per pass over all ranks (groups x micro-batches at verl's first count). One
#: pass costs about 10 us per set in a process that has torch loaded (the shipped sample, 800
#: samples at cap 4096: 75,200 sets, 0.7 s per pass, 3 passes); above this it is opt-in.
COMPARE_AUTO_MAX_KK_SETS = 200_000
def kk_sets_per_pass(rank_lengths: Sequence[np.ndarray], max_token_len: int, group_size: int = 1) -> int:
    """Set objects verl's Karmarkar-Karp builds in one pass over all ranks: per rank, its groups
    times verl's first count ``min(groups, ceildiv(tokens, cap))``. What the comparison costs.

    >>> kk_sets_per_pass([np.array([4096] * 10), np.array([100] * 10)], 4096)
    110
    """
    total = 0
    for lengths in rank_lengths:
        groups = len(lengths) // group_size
        total += groups * max(1, min(groups, ceildiv(int(lengths.sum()), max_token_len)))
    return total


class Progress:
    """The current phase of a run on standard error, so that a user sees at once what is being
    computed, whether the output is a terminal or a pipe.

    On a terminal: one line, rewritten in place (with a bar for the planning's fraction done)
    and erased at the end, so nothing of it is left. Otherwise (a pipe, a file, a CI log): one
    line per phase, ``seqbal: <phase> ...``, and no bar; a phase that ends within
    :data:`LINE_DELAY` seconds writes nothing, so a quick run (or a quick error, which is then the
    only line on standard error) leaves standard error empty, and a slow one says what it is
    computing within a second. Nothing ever goes to standard output; ``quiet=True`` writes
    nothing at all.
    """

    #: Characters of the bar that :meth:`fraction` draws.
    BAR_WIDTH = 30
    #: Seconds a phase runs before a pipe is told about it.
    LINE_DELAY = 0.5

    def __init__(self, stream: Optional[Any] = None, quiet: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.active = not quiet and bool(isatty and isatty())  # the redrawn line of a terminal
        self.lines = not quiet and not self.active  # one line per phase elsewhere
        self.shown = False
        self._percent: Optional[int] = None
        self._pending: Optional[threading.Timer] = None
        self._lock = threading.Lock()

    def phase(self, text: str) -> None:
        if self.active:
            self.stream.write(f"\r\033[Kseqbal: {text} ...")
            self.stream.flush()
            self.shown = True
            self._percent = None
        elif self.lines:
            self._cancel()
            timer = threading.Timer(self.LINE_DELAY, self._write_line, (f"seqbal: {text} ...\n",))
            timer.daemon = True
            with self._lock:
                self._pending = timer
            timer.start()

    def _write_line(self, line: str) -> None:
        with self._lock:
            if self._pending is None or self._pending.args[0] != line:
                return  # the phase ended while the timer fired
            self._pending = None
            self.stream.write(line)
            self.stream.flush()

    def _cancel(self) -> None:
        with self._lock:
            if self._pending is not None:
                self._pending.cancel()
                self._pending = None

    def fraction(self, text: str, done: int, total: int) -> None:
        """``text [#####.....] 42%``, redrawn only when the percentage changes (``done`` is
        clamped to ``total``: a plan may search some items twice)."""
        if not self.active or total <= 0:
            return
        percent = min(100, done * 100 // total)
        if percent == self._percent:
            return
        self._percent = percent
        filled = percent * self.BAR_WIDTH // 100
        self.stream.write(f"\r\033[Kseqbal: {text} [{'#' * filled}{'.' * (self.BAR_WIDTH - filled)}] {percent:3d}%")
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        self._cancel()
        if self.active and self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False


class _OneTorchThread:
    """torch on one thread while the comparison runs, then as it was. Both sides plan on one
    thread; on a machine whose cores are busy, torch's thread pool makes every small tensor op
    wait for them (tens of ms each), which would time the machine, not the code."""

    def __enter__(self) -> "_OneTorchThread":
        import torch

        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.set_num_threads(self.threads)


def _compare_with_verl(split: RankSplit, args: argparse.Namespace, progress: Progress) -> tuple[dict, dict]:
    """verl >= 0.9 (strict loop) and verl <= 0.8 (one pass) on the ranks seqbal planned."""
    options = dict(force_group_size=args.group_size, num_batches_divided_by=args.divisible_by,
                   min_num_micro_batch=args.min_micro_batches)
    progress.phase("importing verl for the comparison (a few seconds; --compare off skips it)")
    code: VerlCode = load_verl()
    dp = len(split.lengths)
    with _OneTorchThread():
        if code.module is not None:
            progress.phase(f"verl {code.version}: rearrange_micro_batches on {dp} rank(s)")
            strict = verl_strict_loop(code, split.lengths, args.max_token_len, **options)
            ran, name = "verl", f"verl {code.version}"
            what = (f"verl {code.version}'s own rearrange_micro_batches"
                    + (", one thread per rank, its all-reduces served in-process" if dp > 1 else ""))
            single_what = (f"verl {code.version}'s own Karmarkar-Karp (the same code as verl 0.8.0's), "
                           f"one pass at verl 0.8's count")
        else:
            progress.phase(f"verl >= 0.9, re-implemented: the strict loop on {dp} rank(s)")
            strict = reimplemented_strict_loop(split.lengths, args.max_token_len, **options)
            ran, name = "reimplementation", "verl >= 0.9"
            what = f"seqbal's re-implementation of verl 0.9.1's rearrange_micro_batches, doing its work ({code.reason})"
            single_what = "seqbal's re-implementation of verl's Karmarkar-Karp, one pass at verl 0.8's count"
        progress.phase("verl <= 0.8: one KK pass")
        single, single_seconds = one_pass_0_8(code, split.lengths, args.max_token_len, **options)
    strict_report = {
        "ran": ran,
        "name": name,
        "implementation": what,
        "verl_version": code.version,
        "verl_import_seconds": code.import_seconds if code.module is not None else None,
        "micro_batches_per_rank": len(strict.parts[0]) if strict.parts else None,
        "kk_passes": strict.passes,
        "all_reduces": strict.all_reduces,
        "failed_at": strict.failed_at,
        "errors": [e for e in strict.errors if e] or None,
        "seconds": strict.seconds,
        "ranks": (_rank_rows(split.lengths, strict.parts, args.max_token_len, args.cost_model, args.group_size)
                  if strict.parts else []),
    }
    single_report = {
        "ran": ran,
        "implementation": single_what,
        "micro_batches_per_rank": single.count if single.parts else None,
        "over_cap": single.over_cap,
        "largest_micro_batch": single.largest,
        "failed": single.parts is None,
        "seconds": single_seconds,
    }
    return strict_report, single_report
