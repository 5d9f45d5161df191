"""What the 0/1 check of an attention mask costs, next to the count of tokens it guards.

    python -m benchmarks.mask_check                 # 4096 x 8192, median of 7 repeats
    python -m benchmarks.mask_check --rows 512 --columns 1024 --repeats 3   # quick

``effective_lengths`` counts the tokens of a non-bool mask with ``mask.sum(-1)``; before that it
checks that the mask holds only 0 and 1 (``torch.aminmax``, plus an equality test for float
masks), so that a 0.999, 2 or NaN mask is an error instead of a wrong count. Each repeat times
the count alone and the check alone on the same mask, one after the other, and the ratio
check / count is taken per repeat: the machine's noise hits both halves of a repeat alike. A
bool mask is counted without a check (it cannot hold anything but 0 and 1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from seqbal.rearrange import _check_zero_one  # noqa: E402


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(rows: int, columns: int, repeats: int, dtype: torch.dtype) -> dict:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, columns + 1, (rows,), generator=generator)
    mask = (torch.arange(columns)[None, :] < lengths[:, None]).to(dtype)
    count = lambda: mask.sum(-1, dtype=torch.int64)  # noqa: E731
    check = lambda: _check_zero_one(mask)  # noqa: E731
    count(), check()  # warm-up
    ratios, count_ms, check_ms = [], [], []
    for _ in range(repeats):
        c, k = _seconds(count), _seconds(check)
        ratios.append(k / c)
        count_ms.append(c * 1e3)
        check_ms.append(k * 1e3)
    return {
        "dtype": str(dtype).replace("torch.", ""),
        "count_ms": statistics.median(count_ms),
        "check_ms": statistics.median(check_ms),
        "ratio_median": statistics.median(ratios),
        "ratio_worst": max(ratios),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--columns", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    print(f"mask {args.rows} x {args.columns}, {args.repeats} repeats, {torch.get_num_threads()} threads")
    print(f"{'dtype':>8} {'count ms':>9} {'check ms':>9} {'check/count median':>19} {'worst':>6}")
    for dtype in (torch.int64, torch.int32, torch.float32):
        r = measure(args.rows, args.columns, args.repeats, dtype)
        print(
            f"{r['dtype']:>8} {r['count_ms']:9.1f} {r['check_ms']:9.1f} {r['ratio_median']:19.2f} {r['ratio_worst']:6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
