#!/usr/bin/env bash
# What one GPU can show that the CPU cannot, in the order that matters most, each step bounded so a
# hang costs its own minutes only; for a machine lent for about a quarter of an hour.
#
#   bash bench/one_gpu_checks.sh              # writes under $OUT (default runs/one-gpu)
#   bash bench/one_gpu_checks.sh --dry-run    # on a CPU: checks the script's commands only
#
# Set up first: an environment with a CUDA build of torch and parabench's packages (`./parabench`
# does it; wheels built for an offline machine install with `pip install .whl/*.whl`). Each step's
# output lands in $OUT/<step>.log and its tables beside it; a failed step is reported and the next
# one runs. Copy the tables into bench/results/ with this command line.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/one-gpu}
mkdir -p "$OUT"
DRY=${1:-}
py=${PYTHON:-python}

step() {  # step <name> <seconds> <command...>
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    if timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; then
        echo "ok    $name ($((SECONDS - started)) s)"
    else
        echo "FAIL  $name (rc $?, $((SECONDS - started)) s): tail of $OUT/$name.log"
        tail -n 5 "$OUT/$name.log"
    fi
}

if [ "$DRY" = "--dry-run" ]; then
    step kernel-table 300 "$py" bench/kernel_table.py --dry-run --out "$OUT/kernel_table.json"
    step overhead 300 "$py" bench/overhead.py --dry-run --only single,ddp,fsdp
    exit 0
fi

"$py" -c "import torch; assert torch.cuda.is_available(), 'no GPU'; print(torch.cuda.get_device_name())" || exit 1
# 1. The planner's kernel table for this card (matmul rates by shape, attention, memory-bound work,
#    launch and collective latency): what every plan on the card uses in place of published figures.
step kernel-table 200 "$py" bench/kernel_table.py --out "$OUT/kernel_table.json"
# 2. Attention by sequence length and head dim, beside the rate the plan gives it.
step attention 120 "$py" bench/attention_kernels.py --out "$OUT/attention.md"
# 3. Unfused attention's matmuls at misaligned head dims (BigScience's 108, 150, 225, 450).
step misaligned-matmul 60 "$py" bench/misaligned_matmul.py --out "$OUT/misaligned_matmul.md"
# 4. One rank of load-balanced ring attention against the plan's 1/cp share.
step ring-attention-rank 60 "$py" bench/ring_attention_rank.py --out "$OUT/ring_attention.md"
# 5. The GPU tests that run on one card (those needing 2 or 4 GPUs skip themselves).
step gpu-tests 240 "$py" -m pytest -q -p no:cacheprovider -n 0 -m gpu tests
# 6. parabench's loop against a hand-written one, native torch (tokens/s at least 0.97 of it).
step overhead-torch 280 "$py" bench/overhead.py --group torch --repeat 1
