"""Rank-side half of the Recorder distributed test (tests/test_timing.py).

Each rank records different micro-batches (its own lengths and seconds, noisy), calls
``Recorder.fit(dp_group)`` counting the collectives it makes, and writes the coefficients as
hex floats (bit for bit) and the workload coefficients; the test process compares the ranks and
a fit of every rank's records in one process. A rank whose pool is too small records the error,
which every rank must raise alike.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta
from typing import Any

import numpy as np

TIMEOUT_S = 30.0


def rank_records(rank: int, count: int = 12) -> list[tuple[list[int], float]]:
    """This rank's micro-batches: lengths drawn per rank, seconds from a known model with noise."""
    rng = np.random.default_rng(100 + rank)
    out = []
    for _ in range(count):
        lengths = rng.integers(1, 2000, int(rng.integers(1, 6))).tolist()
        s = np.asarray(lengths, dtype=np.float64)
        seconds = 2e-3 + 1e-4 * len(s) + 3e-6 * s.sum() + 4e-10 * (s * s).sum()
        out.append((lengths, float(seconds * (1 + 0.05 * rng.standard_normal()))))
    return out


def run(rank: int, world: int, dist: Any) -> dict:
    from seqbal.timing import Recorder

    calls = {"n": 0}
    original = dist.all_gather_object

    def counted(*args, **kw):
        calls["n"] += 1
        return original(*args, **kw)

    dist.all_gather_object = counted
    out: dict[str, Any] = {}
    try:
        recorder = Recorder()
        for lengths, seconds in rank_records(rank):
            recorder.record(lengths, seconds)
        fitted = recorder.fit(dist.group.WORLD)
        out["coefficients"] = [float(v).hex() for v in fitted.model.coefficients]
        out["workload"] = fitted.workload_fn.coefficients
        out["records"] = len(fitted.probes)
        out["device"] = fitted.device
        out["collectives"] = calls["n"]
        small = Recorder()
        if rank == 0:
            small.record([10], 0.001)
        try:
            small.fit(dist.group.WORLD)
            out["small"] = "no error"
        except ValueError as error:
            out["small"] = str(error)
    finally:
        dist.all_gather_object = original
    return out


def main(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    from tests.process_group import close_process_group

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=TIMEOUT_S))
    try:
        result = run(rank, world, dist)
    except Exception:  # recorded, not raised: the peers must not be left waiting
        result = {"crash": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(result, handle)
    close_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
