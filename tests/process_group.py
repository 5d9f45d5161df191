"""End a test rank's gloo process group without racing the other ranks or the interpreter."""

from __future__ import annotations

import os
import sys

import torch.distributed as dist


def close_process_group(*, exit_process: bool = True) -> None:
    """A barrier, ``destroy_process_group``, then (``exit_process``) leave at once with status 0.

    Call it last, once the rank's results are written. The barrier keeps a rank that returns
    from the last collective first from tearing its gloo pairs down while a peer's final message
    is still in flight. The exit skips the interpreter's teardown, where gloo's threads have
    aborted ranks whose work was done ("terminate called without an active exception", exit -6)
    on torch 2.10 and 2.15 alike; the launcher would report the run as failed."""
    dist.barrier()
    dist.destroy_process_group()
    if exit_process:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
