"""The report's figure (``--plot``): per-rank micro-batch workloads against the cap.

matplotlib is imported only when a figure is asked for, so the command costs no matplotlib
import otherwise; :func:`_plot_path` checks the path's suffix (:data:`PLOT_SUFFIXES`) and that
matplotlib is installed before any planning, so a long run does not end in an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .lengths import InputError


PLOT_SUFFIXES = (".png", ".pdf", ".svg")
def _plot_path(path: str) -> str:
    """The file ``--plot`` writes: ``path`` itself, or ``path.png`` when it has no extension.

    Checked before any planning, matplotlib included, so a long run does not end in an error.
    """
    suffix = Path(path).suffix.lower()
    if suffix and suffix not in PLOT_SUFFIXES:
        raise InputError(f"--plot {path}: the plot is an image; give a file ending in {', '.join(PLOT_SUFFIXES)}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(
            "--plot needs matplotlib, which is not installed: pip install matplotlib (or drop --plot)"
        ) from None
    return path if suffix else path + ".png"


def plot_figure(report: dict[str, Any], cap: int) -> Any:
    """The ``--plot`` figure: every micro-batch's tokens, rank by rank, against the cap; one panel
    for seqbal and one for verl's strict loop when it was compared. The legend (one colour per
    rank, up to 16 ranks, and the cap) sits to the right of the panels, never over the bars.

    Raises:
        InputError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError(
            "--plot needs matplotlib, which is not installed: pip install matplotlib (or drop --plot)"
        ) from None
    methods = [("seqbal", report["seqbal"]["ranks"])]
    strict = report.get("verl_0_9")
    if strict and strict["ranks"]:
        methods.append((strict.get("name", "verl >= 0.9"), strict["ranks"]))
    figure, axes = plt.subplots(len(methods), 1, figsize=(11, 3.2 * len(methods)), squeeze=False)
    for axis, (name, rows) in zip(axes[:, 0], methods):
        offset = 0
        for row in rows:
            tokens = row["micro_batch_tokens"]
            axis.bar(range(offset, offset + len(tokens)), tokens, width=0.85, label=f"rank {row['rank']}")
            offset += len(tokens) + 1
        axis.axhline(cap, color="black", linestyle="--", linewidth=1, label=f"cap {cap}")
        total = sum(row["micro_batches"] for row in rows)
        axis.set_title(f"{name}: {total} micro-batches over {len(rows)} rank(s)")
        axis.set_ylabel("effective tokens")
        axis.set_xticks([])
        axis.set_xlim(-1, offset)
        if len(rows) <= 16:
            axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize=7,
                        ncol=1 if len(rows) <= 8 else 2)
    axes[-1, 0].set_xlabel("micro-batches, rank by rank")
    figure.tight_layout()
    return figure


def _plot(path: str, report: dict[str, Any], cap: int) -> None:
    figure = plot_figure(report, cap)
    import matplotlib.pyplot as plt

    try:
        figure.savefig(path, dpi=100, bbox_inches="tight")
    except OSError as error:
        raise InputError(f"{path}: cannot write the plot ({error.strerror or error})") from None
    finally:
        plt.close(figure)
