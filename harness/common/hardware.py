"""GPUs as their data sheets and public measurements give them: peak matmul throughput (for MFU
and the planner), what a matmul really reaches, memory bandwidth, the capacity torch reports,
the links between GPUs.

Sources (docs/planner.md cites each in full):
  peak FLOP/s      vendor data sheets, dense (no sparsity), as tabulated in stas00/ml-engineering
                   compute/accelerator/README.md @ 744d01e1 ("TFLOPS comparison table")
  matmul_efficiency the best bf16 matmul a brute-force shape search found (MAMF, same file,
                   "Maximum Achievable Matmul FLOPS"), over the peak; where no MAMF is published,
                   the best square matmul of zzc0721/torch-performance-test-data database.md
                   @ 9d828276; fp8_efficiency likewise for float8_e4m3fn (H100 SXM 70.9%, H200
                   73.4%, B200 76.3%)
  capacity_gib     the total torch reports (cudaMemGetInfo: OOM messages' "total capacity"),
                   GiB: ml-engineering training/performance/README.md and debug/pytorch.md
                   @ 744d01e1, nvidia-smi totals less about 0.5 GiB where torch's is not published
  links            NVLink and PCIe per GPU and direction: ml-engineering network/README.md
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class GPUSpec:
    """A GPU as its data sheet and the public measurements cited above give it."""

    name: str
    peak_flops: dict[str, float]  # dense FLOP/s by precision; fp32 is plain, not TF32
    hbm_bytes_per_s: float  # memory bandwidth, data sheet
    capacity_gib: float  # the card's memory as torch reports it (total_memory), GiB
    matmul_efficiency: float  # the best measured bf16 matmul over the peak (MAMF)
    # Whose published FlashAttention measurements apply: "hopper" (H100's tables) or "ampere" (A100's).
    attention_family: str
    nvlink_bytes_per_s: float | None  # per GPU and direction; None: no NVLink between the node's GPUs
    pcie_bytes_per_s: float  # the host link (x16), per direction
    sms: int  # streaming multiprocessors (what NCCL's kernels take some of)
    # The best measured fp8 matmul over the fp8 peak (MAMF, float8_e4m3fn); None: no fp8 tensor cores.
    fp8_efficiency: float | None = None

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_gib * GIB


_BF16 = ("bf16", "fp16")


def _flops(tensor: float, fp32: float, fp8: float | None = None) -> dict[str, float]:
    return {**dict.fromkeys(_BF16, tensor), "fp32": fp32, **({"fp8": fp8} if fp8 else {})}


NVLINK3, NVLINK4, NVLINK5 = 300e9, 450e9, 900e9
# fp8's MAMF over bf16's on the H100 SXM (70.9% against 80.3%), for cards with fp8 tensor cores but
# no published fp8 MAMF: their bf16 efficiency scaled by it.
_FP8_RATIO = 0.709 / 0.803
PCIE4, PCIE5 = 31e9, 63e9

# Keys are the names `gpu=` takes; ALIASES map what torch.cuda.get_device_name and the published
# runs call them (AWS's A10G is planned as the A10: its own figures are not in the sources). A card
# whose torch capacity is not published takes nvidia-smi's total less 0.5 GiB.
GPUS = {
    "H100": GPUSpec(
        "H100 SXM 80GB", _flops(989e12, 67e12, 1.979e15), 3.35e12, 79.18, 0.803, "hopper", NVLINK4, PCIE5, 132, 0.709
    ),
    # torchtitan's Grand Teton part: SXM H100 with 96GB HBM2e at 2.4 TB/s and a 500 W limit. Its
    # peak is "between SXM and NVL" (benchmarks/llama3_h100_202412_torchtitan.md, footnote 2):
    # the midpoint of 989 and the NVL's 835 is taken, and said so.
    "H100-96": GPUSpec(
        "H100 SXM 96GB HBM2e 500 W",
        _flops(912e12, 60e12, 1.824e15),
        2.4e12,
        93.1,
        0.803,
        "hopper",
        NVLINK4,
        PCIE5,
        132,
        _FP8_RATIO * 0.803,
    ),
    "H100 NVL": GPUSpec(
        "H100 NVL 94GB",
        _flops(835e12, 60e12, 1.67e15),
        3.9e12,
        93.09,
        0.803,
        "hopper",
        300e9,
        PCIE5,
        132,
        _FP8_RATIO * 0.803,
    ),
    "H100 PCIe": GPUSpec(
        "H100 PCIe 80GB",
        _flops(756e12, 51e12, 1.513e15),
        2.0e12,
        79.18,
        0.656,
        "hopper",
        None,
        PCIE5,
        114,
        _FP8_RATIO * 0.656,
    ),
    "H200": GPUSpec(
        "H200 141GB", _flops(989e12, 67e12, 1.979e15), 4.8e12, 139.8, 0.799, "hopper", NVLINK4, PCIE5, 132, 0.734
    ),
    "B200": GPUSpec(
        "B200 180GB", _flops(2250e12, 80e12, 4.5e15), 8.0e12, 178.35, 0.776, "hopper", NVLINK5, PCIE5, 148, 0.763
    ),
    "A100": GPUSpec("A100 SXM 80GB", _flops(312e12, 19.5e12), 2.039e12, 79.15, 0.869, "ampere", NVLINK3, PCIE4, 108),
    "A100-40": GPUSpec("A100 SXM 40GB", _flops(312e12, 19.5e12), 1.555e12, 39.39, 0.869, "ampere", NVLINK3, PCIE4, 108),
    "A100 PCIe": GPUSpec("A100 PCIe 80GB", _flops(312e12, 19.5e12), 1.935e12, 79.15, 0.811, "ampere", None, PCIE4, 108),
    "L40S": GPUSpec(
        "L40S 48GB",
        _flops(362e12, 91.6e12, 7.33e14),
        0.864e12,
        44.49,
        0.744,
        "ampere",
        None,
        PCIE4,
        142,
        _FP8_RATIO * 0.744,
    ),
    "A10": GPUSpec("A10 24GB", _flops(125e12, 31.2e12), 0.6e12, 21.99, 0.448, "ampere", None, PCIE4, 72),
    "L4": GPUSpec(
        "L4 24GB", _flops(121e12, 30.3e12, 2.42e14), 0.3e12, 21.99, 0.586, "ampere", None, PCIE4, 58, _FP8_RATIO * 0.586
    ),
}

# Lower-case fragments -> key, most specific first: "h100 pcie" must match before "h100".
ALIASES = (
    ("h100 pcie", "H100 PCIe"),
    ("h100 nvl", "H100 NVL"),
    ("h100-96", "H100-96"),
    ("h100 96gb", "H100-96"),
    ("h100-94", "H100-96"),
    ("h100-95", "H100-96"),
    ("a100-pcie", "A100 PCIe"),
    ("a100 pcie", "A100 PCIe"),
    ("a100 80gb pcie", "A100 PCIe"),
    ("a100-sxm4-40gb", "A100-40"),
    ("a100-40", "A100-40"),
    ("a100 40", "A100-40"),
    ("a100", "A100"),
    ("h200", "H200"),
    ("b200", "B200"),
    ("h100", "H100"),
    ("l40s", "L40S"),
    ("a10", "A10"),
    ("l4", "L4"),
)


def gpu_spec(name: str) -> GPUSpec | None:
    """The spec of a GPU by its key (`gpu=` names), or by (part of) the name torch.cuda.get_device_name
    or a published run gives it; None where unknown."""
    if name in GPUS:
        return GPUS[name]
    lowered = name.strip().lower()
    exact = next((spec for key, spec in GPUS.items() if key.lower() == lowered), None)
    return exact or next((GPUS[key] for fragment, key in ALIASES if fragment in lowered), None)
