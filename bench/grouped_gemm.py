"""TransformerEngine's GroupedLinear on this GPU against the plan, by tokens per local expert: the
experts' matmuls of a mixture of experts as Megatron-core runs them (`--moe-grouped-gemm`), where the
plan times each expert's matmul as one of its shape (harness/plan/speed/expert_compute.py, gemm.py).

Each point is one GroupedLinear of EXPERTS local experts, every expert given the same tokens (a
force-balanced router), forward and backward (the input's and the weights' gradients), at DeepSeek-V3's
expert shapes (hidden 7168, expert FFN 2048: the gate and up projection 7168 -> 4096, the down projection
2048 -> 7168), in bf16 and, on Blackwell, MXFP8 (TransformerEngine's MXFP8BlockScaling: its per-expert
quantization and scale swizzles included). The plan's column is gemm.py's lone-kernel time (sustained=1)
of the same three matmuls per expert. docs/planner.md ("Mixtures of experts", against published runs)
says which published rows wait on this measurement: Megatron-Bridge's DGX B200 and B300 rows run 1,024 to
2,048 tokens per local expert.

Needs TransformerEngine (not a parabench dependency). On a GPU machine:
python bench/grouped_gemm.py --gpu B200 --out bench/results/grouped_gemm_<gpu>.md
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_timing import best_seconds, write_table  # noqa: E402
from harness.common.hardware import GPUS  # noqa: E402
from harness.plan.speed.gemm import gemm_seconds  # noqa: E402

EXPERTS = 8
TOKENS_PER_EXPERT = (512, 1024, 2048, 4096, 8192, 16384)
PROJECTIONS = {"gate and up, 7168 -> 4096": (7168, 4096), "down, 2048 -> 7168": (2048, 7168)}
REPEATS = 5


def _engine():
    try:
        import transformer_engine.pytorch as te
        from transformer_engine.common.recipe import MXFP8BlockScaling
    except ImportError:
        print("grouped_gemm.py times TransformerEngine's GroupedLinear: install transformer_engine", file=sys.stderr)
        sys.exit(2)
    return te, MXFP8BlockScaling


def time_grouped(tokens: int, inputs: int, outputs: int, mxfp8: bool) -> float:
    """Seconds of one GroupedLinear's forward and backward over EXPERTS experts of `tokens` tokens each."""
    te, recipe = _engine()
    layer = te.GroupedLinear(EXPERTS, inputs, outputs, bias=False, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(EXPERTS * tokens, inputs, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(EXPERTS * tokens, outputs, device="cuda", dtype=torch.bfloat16)
    splits = [tokens] * EXPERTS

    def once() -> None:
        with te.fp8_autocast(enabled=True, fp8_recipe=recipe()) if mxfp8 else nullcontext():
            out = layer(x, splits)
        out.backward(grad)

    once()
    return best_seconds(once, REPEATS)


def planned(tokens: int, inputs: int, outputs: int, card: str, precision: str) -> float:
    """gemm.py's lone-kernel seconds of the same matmuls: each expert's forward, input and weight gradients."""
    gpu = GPUS[card]
    one = (
        gemm_seconds(tokens, outputs, inputs, gpu, precision, sustained=1.0)
        + gemm_seconds(tokens, inputs, outputs, gpu, precision, sustained=1.0)
        + gemm_seconds(outputs, inputs, tokens, gpu, precision, sustained=1.0)
    )
    return EXPERTS * one


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="H100", choices=sorted(GPUS), help="the planner's card this GPU is")
    parser.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("grouped_gemm.py times GPU kernels: run it on a GPU machine", file=sys.stderr)
        return 2
    _engine()
    mxfp8 = torch.cuda.get_device_capability()[0] >= 10  # MXFP8's block scales are Blackwell's
    recipes = [("bf16", False, "bf16")] + ([("MXFP8", True, "fp8")] if mxfp8 else [])
    lines = [
        f"# TransformerEngine's GroupedLinear by tokens per expert on {torch.cuda.get_device_name()}",
        "",
        f"Command: `python bench/grouped_gemm.py --gpu {args.gpu}`. {EXPERTS} experts, forward and backward, "
        "TFLOP/s measured and as gemm.py plans the same matmuls (a lone kernel).",
        "",
        "| projection | tokens per expert | " + " | ".join(f"{n} measured | {n} planned" for n, _, _ in recipes) + " |",
        "|---|---:|" + "---:|---:|" * len(recipes),
    ]
    for name, (inputs, outputs) in PROJECTIONS.items():
        for tokens in TOKENS_PER_EXPERT:
            flops = 3 * 2 * EXPERTS * tokens * inputs * outputs
            cells = []
            for _, scaled, precision in recipes:
                measured = flops / time_grouped(tokens, inputs, outputs, scaled) / 1e12
                plan = flops / planned(tokens, inputs, outputs, args.gpu, precision) / 1e12
                cells += [f"{measured:.0f}", f"{plan:.0f}"]
            lines.append(f"| {name} | {tokens} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
            torch.cuda.empty_cache()
    write_table(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
