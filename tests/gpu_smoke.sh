#!/usr/bin/env bash
# The checks that need a GPU, in one short run (well under five minutes on one H200):
#   1. the NCCL variants of tests/test_distributed.py (they need two GPUs; they skip on one),
#   2. tests/gpu_smoke.py on NCCL, one rank per GPU: the agreement's collectives on the device,
#      an agreed over-cap error, loss_weights, restore, every micro-batch's peak memory
#      against a forward of one cap-sized sequence, and torch.cuda.max_memory_reserved() over
#      three steps under micro_batch_order="pipeline" and "largest_first" (largest_first must
#      reserve no more, within 5%),
#   3. the PPO actor step (examples/ppo_actor_step.py) on NCCL, one rank per GPU, every
#      loss_agg_mode's gradient checked, then with a short rank (dummy micro-batches),
#   4. tests/gpu_memory_smoke.py: seqbal.memory.calibrate on CUDA (a small transformer, eager
#      and SDPA attention, a 4 GiB budget): the fitted prediction against max_memory_allocated
#      on held-out micro-batches, and planned micro-batches that must stay under the budget.
#
# On a machine with internet, first: `bash tests/gpu_smoke.sh --fetch-wheels` puts the
# tensordict wheels a bare GPU image lacks into .whl/ (git-ignored through .git/info/exclude),
# for CPython 3.12 on x86-64. On the GPU machine: `bash tests/gpu_smoke.sh` (carry .whl along).
# Exit status: non-zero if any step failed; every step runs regardless, under its own timeout.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >>.git/info/exclude
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl tensordict==0.10.0 pyvers==0.1.0 orjson==3.11.4 importlib_metadata==8.7.0
    ls .whl
    exit 0
fi

export PYTHONUNBUFFERED=1
if ! python3 -c "import tensordict" 2>/dev/null; then
    if compgen -G ".whl/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/seqbal-site .whl/*.whl || exit 1
        export PYTHONPATH="/tmp/seqbal-site:${PYTHONPATH:-}"
    else
        echo "tensordict is not installed and .whl/ has no wheels: run 'bash tests/gpu_smoke.sh --fetch-wheels' first"
        exit 1
    fi
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"  # the source tree, not an installed seqbal
python3 -c "import torch, tensordict, seqbal; print('torch', torch.__version__, 'tensordict', tensordict.__version__, \
'cuda', torch.version.cuda, 'devices', torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"
gpus="$(python3 -c 'import torch; print(torch.cuda.device_count())')"
if [[ "$gpus" -lt 1 ]]; then
    echo "FAIL: no CUDA device visible"
    exit 1
fi

status=0
step() {  # step NAME TIMEOUT COMMAND...: run it, report PASS/FAIL with its time
    local name="$1" limit="$2" started=$SECONDS
    shift 2
    echo "== $name"
    if timeout "$limit" "$@"; then
        echo "== PASS $name ($((SECONDS - started)) s)"
    else
        echo "== FAIL $name (exit $?, $((SECONDS - started)) s)"
        status=1
    fi
}

step "NCCL variants of the distributed scenarios (2+ GPUs; skipped on one)" 150 \
    python3 -m pytest -q -p no:cacheprovider -o addopts="" -rs -k nccl tests/test_distributed.py
step "NCCL agreement, peak memory against the cap, reserved memory by micro-batch order ($gpus rank(s))" 150 \
    torchrun --standalone --nproc_per_node="$gpus" tests/gpu_smoke.py
step "PPO actor step on NCCL ($gpus rank(s))" 90 \
    torchrun --standalone --nproc_per_node="$gpus" examples/ppo_actor_step.py
if [[ "$gpus" -ge 2 ]]; then
    step "PPO actor step with a short rank (dummy micro-batches)" 90 \
        torchrun --standalone --nproc_per_node="$gpus" examples/ppo_actor_step.py --short-rank
fi
step "memory calibration on CUDA: prediction and budget (one GPU)" 240 \
    python3 tests/gpu_memory_smoke.py
exit "$status"
