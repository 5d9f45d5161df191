"""Planning on plain lengths needs only NumPy: torch and tensordict load only when used."""

from __future__ import annotations

import subprocess
import sys

import pytest

_REPORT = "import sys; print(sorted(m for m in ('torch', 'tensordict') if m in sys.modules))"


def _loaded_after(code: str) -> str:
    completed = subprocess.run(
        [sys.executable, "-c", f"{code}\n{_REPORT}"], capture_output=True, text=True, timeout=120, check=True
    )
    return completed.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "code",
    [
        "import seqbal; seqbal.plan_micro_batches([1, 2], 4)",
        "import seqbal; seqbal.plan_data_parallel([[1, 2], [3]], 4)",
        "import seqbal; seqbal.build_dp_schedule([5, 3, 8, 1], max_token_len=8, dp_size=2)",
        "import seqbal; seqbal.karmarkar_karp([4, 5, 6], 2, False); seqbal.calculate_workload([3])",
        "from seqbal.integrations.trl import TokenBudgetBatchSampler, pack_rows\n"
        "list(TokenBudgetBatchSampler([3, 5, 2], 8, num_replicas=1, rank=0)); pack_rows([3, 5], 8)",
        "from seqbal.cli import main; import contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        main(['plan', '--help'])\n    except SystemExit:\n        pass",
        "import seqbal; from seqbal.memory import Calibration, MemoryModel\n"
        "c = Calibration(MemoryModel(fixed=100, per_token=10, per_token_squared=1), 10**6)\n"
        "seqbal.plan_micro_batches([100, 20, 30], c.byte_cap, cost_model=c.cost_model); c.max_token_len",
    ],
    ids=["plan_micro_batches", "plan_data_parallel", "build_dp_schedule", "partition", "trl_sampler", "cli_help",
         "memory_planning"],
)
def test_planning_does_not_import_torch(code: str) -> None:
    assert _loaded_after(code) == "[]"


def test_tensordict_features_load_on_use() -> None:
    assert _loaded_after("import seqbal; seqbal.rearrange_micro_batches") == "['tensordict', 'torch']"


def test_unknown_attribute_is_an_attribute_error() -> None:
    import seqbal

    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        seqbal.not_a_name  # noqa: B018
