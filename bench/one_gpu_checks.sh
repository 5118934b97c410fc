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
    step layer-syncs 120 "$py" bench/layer_syncs.py --dry-run
    exit 0
fi

"$py" -c "import torch; assert torch.cuda.is_available(), 'no GPU'; print(torch.cuda.get_device_name())" || exit 1
# 1. The planner's kernel table for this card (matmul rates by shape, attention, memory-bound work,
#    launch and collective latency), each kernel timed on the device: check it with
#    bench/kernel_table_vs_plan.py before copying it to harness/plan/speed/kernel_tables/<card>.json.
step kernel-table 300 "$py" bench/kernel_table.py --out "$OUT/kernel_table.json"
# 2. FSDP against its hand-written loop, three times each (the runs whose parity is open:
#    docs/benchmarks.md), the sections appended to $OUT/fsdp_parity.md.
step overhead-fsdp 240 "$py" bench/overhead.py --only fsdp,fsdp-grad-op,accelerate-fsdp --repeat 3 \
    --time-budget 220 --out "$OUT/fsdp_parity.md"
# 3. The GPU tests that run on one card (those needing 2 or 4 GPUs skip themselves).
step gpu-tests 240 "$py" -m pytest -q -p no:cacheprovider -n 0 -m gpu tests
# 4. Megatron-DeepSpeed's two blocking copies a layer forward (vTrain's rows' `layer_syncs`): the
#    micro-step with and without them at micro-batch 1-8, beside the plan's.
step layer-syncs 120 "$py" bench/layer_syncs.py --out "$OUT/layer_syncs.md"
# 5. Unfused attention's matmuls at misaligned head dims (BigScience's 108, 150, 225, 450).
step misaligned-matmul 60 "$py" bench/misaligned_matmul.py --out "$OUT/misaligned_matmul.md"
# 6. Attention by sequence length and head dim, beside the rate the plan gives it.
step attention 120 "$py" bench/attention_kernels.py --out "$OUT/attention.md"
