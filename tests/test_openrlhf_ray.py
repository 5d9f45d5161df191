"""OpenRLHF's training step in real Ray workers, seqbal installed the documented way (issue 30.4).

docs/openrlhf.md says how ``install()`` reaches OpenRLHF's actors: the driver starts Ray with
``runtime_env={"worker_process_setup_hook": "seqbal.integrations.openrlhf.install"}``. Here a
local Ray cluster on the CPU (2 CPUs, no dashboard) starts two actors with exactly that
runtime_env; they form a gloo group and run OpenRLHF 0.11.2's own ``NaiveReplayBuffer``: its
``setup_dynamic_batch`` must be seqbal's in each worker (the hook ran there, the driver never
installs), plan within the cap with equal counts, and one worker's over-cap sample must be an
error on both.

The workers must import *this* tree's seqbal (CI tests it installed as a wheel in one
environment and editable in another): the runtime_env puts this checkout first on the workers'
``PYTHONPATH``, for the actor's code in ``tests`` (verl 0.9.1 and OpenRLHF 0.11.2 install a
top-level ``tests`` package into site-packages that would shadow it), then the directory that
holds the driver's ``seqbal`` package (the checkout itself where seqbal is not installed as a
wheel, where the wheel's checkout copy has no ``seqbal`` beside ``tests``), and each worker
reports the ``seqbal.__file__`` it imported. On a
CPU, OpenRLHF's modules import only with the stand-ins of tests/trainer_stubs.py (no vLLM, no
flash-attn): a ``sitecustomize`` on the workers' path registers them at interpreter start, which
is the environment's business, not the route's (on a GPU cluster OpenRLHF imports as it is).

The whole Ray run is one subprocess with a hard deadline; it is killed with its process group
if it overruns. Skipped, with the reason, where Ray or OpenRLHF is absent.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import seqbal
import seqbal.integrations.openrlhf

from .deadline import run_with_deadline
from .invariants import assert_plan_invariants

CAP = 4096
DEADLINE_S = 300  # the Ray run (cluster start, two workers importing torch and OpenRLHF, the steps)
REPO = Path(__file__).resolve().parent.parent
HOOK = "seqbal.integrations.openrlhf.install"  # the documented worker_process_setup_hook


def _missing() -> str | None:
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed"
    from .test_openrlhf import OPENRLHF_MISSING

    return OPENRLHF_MISSING


MISSING = _missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def worker_cases(rank: int) -> dict[str, list[int]]:
    """Per case, this worker's buffer (one 16-sample step)."""
    return {
        "within_cap": ([3000, 1200, 800, 2500] * 4) if rank == 0 else ([60] * 16),
        "rank0_sample_over_cap": ([CAP + 100] + [100] * 15) if rank == 0 else ([100] * 16),
    }


class TrainingActor:
    """One OpenRLHF actor rank (a Ray actor): nothing of seqbal is installed by this code."""

    def __init__(self, rank: int, world: int, init_method: str) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        self.rank, self.world = rank, world
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=30))

    def run(self) -> dict:
        from types import SimpleNamespace as NS

        import torch
        import torch.distributed as dist

        import seqbal as worker_seqbal
        from openrlhf.trainer.ppo_utils.experience import Experience
        from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
        from seqbal.integrations import openrlhf as seqbal_openrlhf

        method = NaiveReplayBuffer.setup_dynamic_batch
        record = {
            "seqbal_file": worker_seqbal.__file__,
            "installed_by_hook": seqbal_openrlhf.is_installed(),
            "method_is_seqbals": getattr(method, "__wrapped__", None) is seqbal_openrlhf.setup_dynamic_batch,
            "cases": {},
        }
        args = NS(
            train=NS(batch_size=16 * self.world, max_tokens_per_gpu=CAP),
            rollout=NS(batch_size=16 * self.world, n_samples_per_prompt=1),
            ds=NS(ring_attn_size=1, tensor_parallel_size=1),
        )
        strategy = NS(args=args, ds_device_mesh={"dp": NS(get_group=lambda: dist.group.WORLD)}, world_size=self.world)
        for name, lengths in worker_cases(self.rank).items():
            torch.cuda.current_device = lambda: 0  # OpenRLHF's constructor: torch.device("cuda:0")
            buffer = NaiveReplayBuffer(1, dynamic_batch=True)
            buffer.items = [
                Experience(
                    sequences=torch.arange(n)[None, :],
                    attention_mask=torch.ones(1, n, dtype=torch.long),
                    action_mask=torch.ones(1, max(1, n // 2), dtype=torch.bool),
                    total_length=torch.tensor([n]),
                    response_length=torch.tensor([max(1, n // 2)]),
                )
                for n in lengths
            ]
            try:
                buffer.setup_dynamic_batch(strategy)
                record["cases"][name] = {"lengths": lengths, "indices": buffer.dynamic_indices}
            except Exception as error:  # noqa: BLE001 - every outcome is data for the test
                record["cases"][name] = {"error_type": type(error).__name__, "error": str(error)}
        dist.destroy_process_group()
        return record


def driver(out_file: str, stand_ins: str) -> None:
    """The Ray driver (run in a subprocess by the test): the documented ray.init, two actors."""
    import socket

    import ray

    seqbal_root = str(Path(seqbal.__file__).resolve().parent.parent)
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=tempfile.mkdtemp(prefix="sqb-ray-"),
        runtime_env={
            "worker_process_setup_hook": HOOK,
            "env_vars": {"PYTHONPATH": os.pathsep.join([str(REPO), seqbal_root, stand_ins]), "OMP_NUM_THREADS": "1"},
        },
    )
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        remote = ray.remote(num_cpus=1)(TrainingActor)
        actors = [remote.remote(rank, 2, f"tcp://127.0.0.1:{port}") for rank in range(2)]
        records = ray.get([actor.run.remote() for actor in actors], timeout=DEADLINE_S - 60)
        Path(out_file).write_text(json.dumps({"driver_seqbal": seqbal.__file__, "records": records}))
    finally:
        ray.shutdown()


STAND_INS = """\
# Test-only: OpenRLHF's modules import on a CPU with tests/trainer_stubs.py's stand-ins.
try:
    from tests.trainer_stubs import import_openrlhf_modules

    import_openrlhf_modules()
except Exception:
    pass
"""


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("openrlhf-ray")
    stand_ins = work / "stand_ins"
    stand_ins.mkdir()
    (stand_ins / "sitecustomize.py").write_text(STAND_INS)
    out = work / "records.json"
    code = textwrap.dedent(f"""
        from tests.test_openrlhf_ray import driver
        driver({str(out)!r}, {str(stand_ins)!r})
    """)
    # The driver imports the seqbal this process imported (not whatever its working directory
    # holds: `python -c` puts that first on sys.path, so it runs in an empty one).
    seqbal_root = str(Path(seqbal.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), seqbal_root]))
    done = run_with_deadline([sys.executable, "-c", code], deadline_s=DEADLINE_S, cwd=str(work), env=env,
                             what="the Ray run", merge_stderr=True)
    output = done.stdout
    assert done.returncode == 0 and out.exists(), output[-6000:]
    return json.loads(out.read_text())


def test_the_documented_hook_installs_this_seqbal_in_every_worker(ray_run):
    assert not seqbal.integrations.openrlhf.is_installed()  # not by the test process, nor the driver
    for record in ray_run["records"]:
        assert Path(record["seqbal_file"]).resolve() == Path(ray_run["driver_seqbal"]).resolve() == Path(seqbal.__file__).resolve()
        assert record["installed_by_hook"] and record["method_is_seqbals"], record


def test_openrlhfs_step_in_ray_workers_plans_within_the_cap(ray_run):
    cases = [r["cases"]["within_cap"] for r in ray_run["records"]]
    assert len(cases[0]["indices"]) == len(cases[1]["indices"]) > 1, cases
    for case in cases:
        assert_plan_invariants(case["lengths"], case["indices"], CAP)


def test_an_over_cap_sample_in_one_worker_is_an_error_in_both(ray_run):
    errors = [r["cases"]["rank0_sample_over_cap"] for r in ray_run["records"]]
    assert [e.get("error_type") for e in errors] == ["MicroBatchPlanError"] * 2, errors
    assert "exceeds max_token_len" in errors[0]["error"] and "OpenRLHF training step 0" in errors[0]["error"]
    assert "rank 0 of the data-parallel group failed" in errors[1]["error"]
