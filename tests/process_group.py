"""Tear down a test's gloo process group without racing the other ranks."""

from __future__ import annotations

import torch.distributed as dist


def close_process_group() -> None:
    """A barrier, then ``destroy_process_group``. Without the barrier, a rank that returns from
    the last collective first can tear its gloo pairs down while a peer's final message is still
    in flight; on torch 2.10 the peer then aborts ("terminate called without an active
    exception") after its work is done, and the launcher reports the run as failed."""
    dist.barrier()
    dist.destroy_process_group()
