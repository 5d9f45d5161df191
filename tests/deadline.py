"""Run a command that starts processes of its own (torchrun's ranks, a Ray cluster) under a hard
deadline: past it the whole process group is killed, so no rank is left waiting in a collective
after the test has failed (killing the launcher alone leaves its children running)."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Mapping, Optional, Sequence

import pytest


def run_with_deadline(
    command: Sequence[str], *, deadline_s: float, cwd: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None, what: str = "the command", merge_stderr: bool = False,
) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a session of its own; fails the test, killing the session, after
    ``deadline_s`` seconds, with the end of what it printed."""
    process = subprocess.Popen(
        list(command), cwd=cwd, env=None if env is None else dict(env), start_new_session=True, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
    )
    try:
        stdout, stderr = process.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{what} passed its {deadline_s} s deadline (killed):\n{(stdout or '')[-4000:]}\n{(stderr or '')[-2000:]}")
    return subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr)
