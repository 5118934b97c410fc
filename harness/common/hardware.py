"""GPUs as their data sheets and public measurements give them: peak matmul throughput (for MFU
and the planner), what a matmul really reaches, memory bandwidth, the capacity torch reports,
the links between GPUs and to the host. Each card's `sources` names where its figures come from
(the plan's header says it); docs/planner.md tabulates them.

Sources:
  peak FLOP/s      vendor data sheets, dense (no sparsity), as tabulated in stas00/ml-engineering
                   compute/accelerator/README.md @ 744d01e1 ("TFLOPS comparison table")
  matmul_efficiency the best bf16 matmul a brute-force shape search found (MAMF, same file,
                   "Maximum Achievable Matmul FLOPS"), over the peak; where no MAMF is published,
                   the best square matmul of zzc0721/torch-performance-test-data database.md
                   @ 9d828276; fp8_efficiency likewise for float8_e4m3fn (H100 SXM 70.9%, H200
                   73.4%, B200 76.3%); fp4_efficiency the largest fp4 matmul measured on the card
                   (B200: cuBLASLt's MXFP4 at 8192^3), else on a GB200 (NVFP4 at 16384^3)
  long_run_matmul  the largest square matmul after 10,000 warm-up iterations (Azure's AI benchmarking
                   guide, cuBLASLt; hipBLASLt on the MI300X) over the card's MAMF: H100 98.2%, H200 94.0%,
                   A100 94.6%, GB200 80.4%, MI300X 87.5%
  capacity_gib     the total torch reports (cudaMemGetInfo: OOM messages' "total capacity"),
                   GiB: ml-engineering training/performance/README.md and debug/pytorch.md
                   @ 744d01e1, nvidia-smi totals less about 0.5 GiB where torch's is not published
                   (MLPerf's system files print them for B300, GB200 and GB300)
  links            NVLink, Infinity Fabric and PCIe per GPU and direction, NVLink-C2C as measured:
                   ml-engineering network/README.md
  host_memory_gib  the host memory of one host of the card's reference system (a DGX, a GB200/GB300
                   compute tray, a cloud instance), as _HOSTS cites it; where none is published, an
                   assumed one, said so
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 2**30


@dataclass(frozen=True)
class GPUSpec:
    """A GPU as its data sheet and the public measurements cited above give it."""

    name: str
    peak_flops: dict[str, float]  # dense FLOP/s by precision; fp32 is plain, not TF32
    hbm_bytes_per_s: float  # memory bandwidth, data sheet
    capacity_gib: float  # the card's memory as torch reports it (total_memory), GiB
    matmul_efficiency: float  # the best measured bf16 (fp16 on Volta) matmul over the peak (MAMF)
    # Whose published attention measurements apply: "ampere" (A100's tables), "hopper" (H100's), "blackwell"
    # (B200's) or "cdna" (MI300X's); `attention_assumed` says where the card's attention rates come from.
    attention_family: str
    nvlink_bytes_per_s: float | None  # per GPU and direction; None: no NVLink between the node's GPUs
    pcie_bytes_per_s: float  # the PCIe link (x16), per direction
    sms: int  # streaming multiprocessors, or AMD's compute units (what the collectives' kernels take some of)
    # The best measured fp8 matmul over the fp8 peak (MAMF, float8_e4m3fn); None: no fp8 tensor cores.
    fp8_efficiency: float | None = None
    # The best measured fp4 (NVFP4, MXFP4) matmul over the fp4 peak; None: no fp4 tensor cores.
    fp4_efficiency: float | None = None
    # NCCL's generation (its tuning tables): volta, ampere, hopper, blackwell; AMD's: cdna3, cdna4 (RCCL).
    generation: str = "hopper"
    # The links between a node's GPUs: "nvswitch" (every GPU on the switch: NVLink SHARP from Hopper
    # on), "xgmi-mesh" (AMD Infinity Fabric: a link to each peer, no switch), "pcie".
    scale_up: str = "nvswitch"
    nvlink_links: int = 18  # NVLink links per GPU (NCCL's NVLS search loads each GPU's links)
    nvlink_domain: int = 8  # GPUs on one NVLink domain by default (a rack's 72 on GB200/GB300 NVL72)
    gpus_per_host: int = 8  # GPUs per host (a GB200/GB300 compute tray holds 4)
    # The host's memory (what offload keeps its state in), GiB per host of gpus_per_host GPUs; None: unknown.
    host_memory_gib: float | None = None
    # Pinned host <-> GPU copies as measured (nvbandwidth) where the host link is not PCIe
    # (NVLink-C2C to a Grace CPU); None: PCIe, at step_time's share of its rate.
    host_copy_bytes_per_s: float | None = None
    # The link to the host CPU where it is not the card's PCIe x16 (pcie_bytes_per_s): "NVLink-C2C to a
    # Grace CPU" on GB200 and GB300, whose host issues kernels slower (host_issue.py); "": PCIe.
    host_link: str = ""
    # An eager kernel's host time on this card's host, us, where the plan was given it (host_us_per_kernel=):
    # the host's own pace in place of the reference x86 host's (host_issue.py); None: not given.
    host_us_per_kernel: float | None = None
    nic_gbps: float = 400  # the platform's scale-out card per GPU (the default inter_node=)
    power_w: float | None = None  # the board's power limit (data sheet)
    sources: str = ""  # where each figure of this card comes from (said in the plan's header)
    attention_assumed: str = ""  # what is assumed for attention where no kernel was measured on it
    # Exponentials the special-function units compute per dense 16-bit tensor-core FLOP, both per SM and
    # clock (attention.py's softmax term); None: as its attention family's measured card.
    exp_per_tensor_flop: float | None = None
    # The largest square matmul's rate after 10,000 warm-up iterations (Azure's cuBLASLt benchmark, _AZURE)
    # over the card's MAMF in the same precision: what the card sustains once its clocks settle under a
    # long load (a card without its own: its die's measured one); None: the H100's assumed (gemm.py's
    # sustained_share).
    long_run_matmul: float | None = None
    # Its tensor cores' peak set below what its SMs give at their clock (an export-limited part: the
    # H20's 148 TFLOP/s from the H100's SM): attention's work beside its matmuls runs at its SMs' own pace
    # (attention.capped_card_rate), not at its tensor peak's share of the measured card's.
    tensor_capped: bool = False

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_gib * GIB

    @property
    def host_memory_bytes(self) -> float | None:
        return None if self.host_memory_gib is None else self.host_memory_gib * GIB

    @property
    def vendor(self) -> str:
        return "AMD" if self.generation.startswith("cdna") else "NVIDIA"

    @property
    def tensor_flops(self) -> float:
        """The 16-bit tensor peak (bf16's, fp16's on a card without bf16)."""
        return self.peak_flops.get("bf16") or self.peak_flops["fp16"]


_BF16 = ("bf16", "fp16")


def _flops(tensor: float, fp32: float, fp8: float | None = None, fp4: float | None = None) -> dict[str, float]:
    return {
        **dict.fromkeys(_BF16, tensor),
        "fp32": fp32,
        **({"fp8": fp8} if fp8 else {}),
        **({"fp4": fp4} if fp4 else {}),
    }


NVLINK3, NVLINK4, NVLINK5 = 300e9, 450e9, 900e9
# fp8's MAMF over bf16's on the H100 SXM (70.9% against 80.3%), for cards with fp8 tensor cores but
# no published fp8 MAMF: their bf16 efficiency scaled by it.
_FP8_RATIO = 0.709 / 0.803
PCIE4, PCIE5 = 31e9, 63e9
_ML_ENG = "stas00/ml-engineering compute/accelerator/README.md @ 744d01e1"
_ZZC = "zzc0721/torch-performance-test-data database.md @ 9d828276"
_MLPERF = "mlcommons/training_results_v5.1 @ 441d65f4 systems/"
# The best fp4 matmul measured on a Blackwell card: cuBLASLt NVFP4 at 16384^3 on an Azure ND GB200 v6,
# 7627.6 of 10000 TFLOP/s (Azure/AI-benchmarking-guide Azure_Results/ND_GB200_v6_results.md @ 2a370be6).
_FP4_BLACKWELL = 0.763
# Blackwell Ultra's die (B300; GB300 its own not measured): cuBLASLt NVFP4 at 8192^3 on a B300 SXM6 AC at its
# 1100 W limit, 8333.1 of 15000 TFLOP/s (cuBLAS 13.8, CUDA-graph replays timed by CUPTI, median of 8 rounds:
# vincentzed/gemm3 benchmarks/results/libraries-8192.json @ 60434445; cuDNN's and CUTLASS's within 2% of it).
_FP4_B300 = 8333.1 / 15000
# The B200's own: cuBLASLt's fp4 x fp4 (MXFP4) matmul at 8192^3 on a B200, 5239 TFLOP/s ("cublasTest 13.3
# direct binary", CUDA 12.9: deepseek-ai/DeepGEMM pull request 348, its dense table), over the B200's dense
# fp4 peak of 9000 (DGX B200 data sheet, ml-engineering's fp4 column): the share of its format's peak, as
# every efficiency here, taken for NVFP4 at its 10000. A card's own measurement before its die-mate's.
_FP4_B200 = 5239.0 / 9000
# Azure's AI benchmarking guide runs cuBLASLt on random data after 10,000 warm-up iterations; its 16384^3
# rate over the card's MAMF in that precision (Azure_Results/ND_*_results.md): H100 fp8 1377.3 of 1402.6
# (samuel-bohman/AI-benchmarking-guide @ 26d18e94, ND H100 v5), H200 fp8 1366.3 of 1453.4 (Azure/AI-benchmarking-guide
# @ 7f20e5fa, ND H200 v5), A100 fp16 256.5 of 271.1 (@ 3bb66cac, ND A100 v4), GB200 fp8 2906.9 of 3615.6
# (@ 2a370be6, ND GB200 v6). The benchmark (Benchmarks/NVIDIA/GEMMCublasLt.py) times 1,000 iterations after
# the 10,000 warm-ups: 30-60 s of the largest matmul back to back, as a training run keeps its cards busy.
_AZURE = "Azure's cuBLASLt after 10,000 warm-up iterations (Azure_Results/ND_*_results.md)"
_LONG_RUN = {"H100": 1377.3 / 1402.6, "H200": 1366.3 / 1453.4, "A100": 256.5 / 271.1, "GB200": 2906.9 / 3615.6}
# MI300X's fp8 against its bf16: hipBLASLt fp8 at 6144x12288x12288 on an Azure ND MI300X v5, 1159.5 of
# 2610 TFLOP/s (samuel-bohman/AI-benchmarking-guide Azure_Results/ND_MI300X_v5_results.md @ 3de0c294),
# over its bf16 MAMF (0.514).
_FP8_CDNA = 0.444
# MI300X's hipBLASLt fp8 at 16384^3 in the same table (after the same 10,000 warm-ups), 1015.1 TFLOP/s, over
# its fp8 MAMF (_FP8_CDNA's 1159.5): what it sustains once its clocks settle (hipBLASLt for cuBLASLt).
_LONG_RUN_MI300X = 1015.1 / 1159.5
_AZURE_MI300X = "samuel-bohman/AI-benchmarking-guide Azure_Results/ND_MI300X_v5_results.md @ 3de0c294"
_MI300X_ATTENTION = (
    f"FlashAttention-2 (ROCm's composable_kernel build) and PyTorch's unfused attention as measured on an MI300X "
    f"({_AZURE_MI300X}: 328.6 and 145.9 TFLOP/s at 8k, head dim 64), the H100's curves over sequence and head "
    "dim scaled to them"
)
_CDNA_ATTENTION = (
    "no attention kernel measured on this card in the sources: the MI300X's measured FlashAttention-2 share of "
    "its peak is assumed"
)
# Blackwell's SM: 16 exponentials a clock (MUFU.EX2) beside 8,192 dense bf16 tensor FLOPs a clock: from
# the H100 to the B200 the tensor peak rises from 1 to 2.25 PFLOP/s "while both the SFU count and shared
# memory bandwidth remain unchanged" (the FlashAttention-4 paper, arXiv 2603.05451, and its blog); Blackwell
# Ultra (B300, GB300) doubles the SFUs' MUFU.EX2 throughput over Blackwell (NVIDIA's technical blog "Making
# Softmax More Efficient with NVIDIA Blackwell Ultra").
BLACKWELL_EXP, BLACKWELL_ULTRA_EXP = 16 / 8192, 32 / 8192
_BLACKWELL_ATTENTION = (
    "cuDNN's and FlashAttention-2's rates measured on a Blackwell B200 (NVIDIA/cudnn-frontend benchmark "
    "artifacts, cuDNN 9.13.1), carried to this card by its tensor peak and its SFU rate for the softmax's exponentials"
)
_BLACKWELL_ULTRA_ATTENTION = _BLACKWELL_ATTENTION + " (Blackwell Ultra: twice the B200's exponentials per clock)"

# Keys are the names `gpu=` takes; ALIASES map what torch.cuda.get_device_name and the published
# runs call them (AWS's A10G is planned as the A10: its own figures are not in the sources). A card
# whose torch capacity is not published takes nvidia-smi's total less 0.5 GiB.
GPUS = {
    "H100": GPUSpec(
        "H100 SXM 80GB",
        _flops(989e12, 67e12, 1.979e15),
        3.35e12,
        79.18,
        0.803,
        "hopper",
        NVLINK4,
        PCIE5,
        132,
        0.709,
        power_w=700,
        long_run_matmul=_LONG_RUN["H100"],
        sources=f"{_ML_ENG} (peaks, memory, MAMF 80.3% bf16, 70.9% fp8, 700 W); {_AZURE} (98.2% of MAMF)",
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
        power_w=500,
        sources="pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (the part); the H100 SXM's MAMF",
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
        nvlink_links=12,
        power_w=400,
        sources=f"{_ML_ENG} (peaks, memory); the H100 SXM's MAMF",
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
        scale_up="pcie",
        power_w=350,
        sources=f"{_ML_ENG} (peaks, memory); {_ZZC} (best square matmul, 65.6%)",
    ),
    "H200": GPUSpec(
        "H200 141GB",
        _flops(989e12, 67e12, 1.979e15),
        4.8e12,
        139.8,
        0.799,
        "hopper",
        NVLINK4,
        PCIE5,
        132,
        0.734,
        power_w=700,
        long_run_matmul=_LONG_RUN["H200"],
        sources=f"{_ML_ENG} (peaks, memory, MAMF 73.4% fp8, 700 W); {_ZZC} (bf16 79.9%); {_AZURE} (94.0% of MAMF)",
    ),
    # H800: the H100 SXM's die with NVLink cut to 8 of its 18 links (400 GB/s duplex). Its peak
    # (volcengine/verl verl/utils/flops_counter.py @ b178a3cd: 989e12) is the H100's; fp8, memory
    # bandwidth, power and MAMF are the H100 SXM's (the same die and clocks), not published for it.
    "H800": GPUSpec(
        "H800 SXM 80GB",
        _flops(989e12, 67e12, 1.979e15),
        3.35e12,
        79.18,
        0.803,
        "hopper",
        200e9,
        PCIE5,
        132,
        0.709,
        nvlink_links=8,
        power_w=700,
        sources=(
            "volcengine/verl verl/utils/flops_counter.py @ b178a3cd (989 TF bf16); FlagOpen/FlagPerf "
            "training/nvidia/llama2_70B-megatron/README.md @ 0171acaa (80GB); NVLink 400 GB/s duplex: a "
            "third-party page, DeepEP's ~160 GB/s measured (deepseek-ai/DeepEP docs/legacy.md @ 0297fc80); "
            "fp8, HBM, power and MAMF assumed the H100 SXM's"
        ),
    ),
    # H20: a memory-rich, compute-poor Hopper; its square matmul runs at 95.8% of its 148 TF peak
    # (zzc0721's sweep), far above the H100's: little compute under the same power limit. Its tensor peak
    # is capped: its 44 TF of FP32, the H100 SM's lanes at its count and clock, would carry about 650 TF
    # of bf16 uncapped.
    "H20": GPUSpec(
        "H20 96GB",
        _flops(148e12, 44e12, 296e12),
        4.0e12,
        93.1,
        0.958,
        "hopper",
        NVLINK4,
        PCIE5,
        78,
        _FP8_RATIO * 0.958,
        power_w=400,
        tensor_capped=True,
        attention_assumed=(
            "the H100's rates: cuDNN's and FlashAttention-3's FLOPs at this card's capped tensor peak and the "
            "rest of their time at its SMs' pace (its FP32 peak over the H100's), FlashAttention-2's at the "
            "H100's share of the tensor peak"
        ),
        sources=(
            "volcengine/verl verl/utils/flops_counter.py @ b178a3cd (148 TF bf16); "
            f"{_ZZC} (best square matmul 141.86 TF: 95.8%); memory 96 GB, 4.0 TB/s, 400 W, NVLink 900 GB/s "
            "duplex, 44 TF FP32 and 78 SMs from third-party pages; fp8 at twice bf16 (Hopper's ratio) and "
            "torch's capacity as the H100-96's assumed"
        ),
    ),
    "B200": GPUSpec(
        "B200 180GB",
        _flops(2250e12, 80e12, 4.5e15, 10.0e15),
        8.0e12,
        178.35,
        0.776,
        "blackwell",
        NVLINK5,
        PCIE5,
        148,
        0.763,
        fp4_efficiency=_FP4_B200,
        generation="blackwell",
        power_w=1000,
        long_run_matmul=_LONG_RUN["GB200"],
        sources=(
            f"{_ML_ENG} (peaks 2250/4500 TF and NVFP4 10000, 8 TB/s, MAMF 77.6% bf16 and 76.3% fp8, 1000 W); fp4: "
            "cuBLASLt's MXFP4 at 8192^3 on a B200, 5239 of 9000 TF (deepseek-ai/DeepGEMM pull request 348); the "
            "long-run matmul the GB200's measured one (the same die, assumed)"
        ),
        attention_assumed=_BLACKWELL_ATTENTION,
        exp_per_tensor_flop=BLACKWELL_EXP,
    ),
    "B300": GPUSpec(
        "B300 288GB",
        _flops(2250e12, 80e12, 4.5e15, 15.0e15),
        8.0e12,
        268.1,
        0.786,
        "blackwell",
        NVLINK5,
        PCIE5,
        148,
        0.745,
        fp4_efficiency=_FP4_B300,
        generation="blackwell",
        nic_gbps=800,
        power_w=1000,
        long_run_matmul=_LONG_RUN["GB200"],
        sources=(
            f"{_ML_ENG} (peaks 2250/4500 TF and NVFP4 15000, 288 GB, 8 TB/s, MAMF 78.6% bf16 and 74.5% fp8, 1000 W; "
            f"148 and 152 SMs measured on two SKUs: 148 taken); {_MLPERF}nebius_b300_n1.json (275040 MiB); fp4: "
            "cuBLASLt NVFP4 at 8192^3 on a B300, 8333 of 15000 TF (vincentzed/gemm3 @ 60434445); the long-run "
            "matmul the GB200's measured one (a Blackwell die held to no more power than the GB200's, as the "
            "B200 is, assumed)"
        ),
        attention_assumed=_BLACKWELL_ULTRA_ATTENTION,
        exp_per_tensor_flop=BLACKWELL_ULTRA_EXP,
    ),
    # GB200: the Blackwell GPU of a Grace-Blackwell superchip, four to a compute tray, 72 on one
    # NVLink domain (NVL72), its host a Grace CPU over NVLink-C2C.
    "GB200": GPUSpec(
        "GB200 186GB",
        _flops(2500e12, 80e12, 5.0e15, 10.0e15),
        8.0e12,
        184.5,
        0.729,
        "blackwell",
        NVLINK5,
        PCIE5,
        148,
        0.723,
        fp4_efficiency=_FP4_BLACKWELL,
        generation="blackwell",
        nvlink_domain=72,
        gpus_per_host=4,
        host_copy_bytes_per_s=201e9,
        host_link="NVLink-C2C to a Grace CPU",
        power_w=1200,
        long_run_matmul=_LONG_RUN["GB200"],
        sources=(
            f"{_ML_ENG} (peaks 2500/5000/10000 TF, 8 TB/s, MAMF 72.9% bf16 and 72.3% fp8, 1200 W); "
            f"{_AZURE} (80.4% of MAMF); "
            f"{_MLPERF}tyche_ngpu72_ngc25.09_nemo.json (189471 MiB, 4 GPUs a tray); Azure/AI-benchmarking-guide "
            "Azure_Results/ND_GB200_v6_results.md @ 2a370be6 (NVFP4 matmul 76.3%, host copies 201 GB/s); SMs "
            "not published: the B200's 148 assumed"
        ),
        attention_assumed=_BLACKWELL_ATTENTION,
        exp_per_tensor_flop=BLACKWELL_EXP,
    ),
    # GB300: Blackwell Ultra (B300's die) in a Grace-Blackwell NVL72 rack.
    "GB300": GPUSpec(
        "GB300 279GB",
        _flops(2500e12, 80e12, 5.0e15, 15.0e15),
        8.0e12,
        277.0,
        0.786,
        "blackwell",
        NVLINK5,
        PCIE5,
        148,
        0.745,
        fp4_efficiency=_FP4_B300,
        generation="blackwell",
        nvlink_domain=72,
        gpus_per_host=4,
        host_copy_bytes_per_s=359e9,
        host_link="NVLink-C2C to a Grace CPU",
        nic_gbps=800,
        power_w=1400,
        sources=(
            f"{_ML_ENG} (peaks 2500/5000/15000 TF, 1400 W); {_MLPERF}theia_ngpu72_ngc25.09_nemo.json (284208 "
            "MiB, 4 GPUs a tray, ConnectX-8 800G); stas00/ml-engineering network/README.md @ 744d01e1 (NVLink-C2C: "
            "359 GB/s host-to-device on half a GB300 module); HBM bandwidth, SMs, MAMF and the fp4 matmul not "
            "published: the B300's (the same die) assumed"
        ),
        attention_assumed=_BLACKWELL_ULTRA_ATTENTION,
        exp_per_tensor_flop=BLACKWELL_ULTRA_EXP,
    ),
    "A100": GPUSpec(
        "A100 SXM 80GB",
        _flops(312e12, 19.5e12),
        2.039e12,
        79.15,
        0.869,
        "ampere",
        NVLINK3,
        PCIE4,
        108,
        generation="ampere",
        nvlink_links=12,
        nic_gbps=200,
        power_w=400,
        long_run_matmul=_LONG_RUN["A100"],
        sources=f"{_ML_ENG} (peaks, memory, MAMF 86.9%); {_AZURE} (94.6% of MAMF)",
    ),
    "A100-40": GPUSpec(
        "A100 SXM 40GB",
        _flops(312e12, 19.5e12),
        1.555e12,
        39.39,
        0.869,
        "ampere",
        NVLINK3,
        PCIE4,
        108,
        generation="ampere",
        nvlink_links=12,
        nic_gbps=200,
        power_w=400,
        long_run_matmul=_LONG_RUN["A100"],
        sources=f"{_ML_ENG} (peaks, memory, MAMF 86.9%); the A100 SXM 80GB's long-run matmul (the same die at 400 W)",
    ),
    # A800: the A100 SXM with NVLink cut to 400 GB/s duplex (8 of its 12 links), for export.
    "A800": GPUSpec(
        "A800 SXM 80GB",
        _flops(312e12, 19.5e12),
        2.039e12,
        79.15,
        0.854,
        "ampere",
        200e9,
        PCIE4,
        108,
        generation="ampere",
        nvlink_links=8,
        nic_gbps=200,
        power_w=400,
        sources=(
            "volcengine/verl verl/utils/flops_counter.py @ b178a3cd (312 TF bf16); "
            f"{_ZZC} (A800 SXM4 80GB best square matmul 266.48 TF: 85.4%); NVLink 400 GB/s duplex (NVIDIA's "
            "A800 data sheet); memory, bandwidth and long-run matmul the A100 SXM 80GB's"
        ),
        long_run_matmul=_LONG_RUN["A100"],
    ),
    "A100 PCIe": GPUSpec(
        "A100 PCIe 80GB",
        _flops(312e12, 19.5e12),
        1.935e12,
        79.15,
        0.811,
        "ampere",
        None,
        PCIE4,
        108,
        generation="ampere",
        scale_up="pcie",
        nic_gbps=200,
        power_w=300,
        sources=f"{_ML_ENG} (peaks, memory, MAMF 81.1%)",
    ),
    # V100 SXM2: fp16 tensor cores only (no bf16, no fp8), NVLink 2 (six links of 25 GB/s per direction).
    "V100-32": GPUSpec(
        "V100 SXM2 32GB",
        {"fp16": 125e12, "fp32": 15.7e12},
        0.9e12,
        31.75,
        0.759,
        "ampere",
        150e9,
        15.75e9,
        80,
        generation="volta",
        nvlink_links=6,
        nic_gbps=100,
        power_w=300,
        sources=(
            "NVIDIA's Tesla V100 data sheet (SXM2: 125 TF fp16 tensor, 15.7 TF fp32, 900 GB/s HBM2, 300 GB/s "
            "NVLink duplex, 300 W, 80 SMs); torch's 31.75 GiB (its OOM message on a V100 32GB); "
            f"{_ZZC} (V100-SXM2-16GB best square fp16 matmul 94.84 TF: 75.9%)"
        ),
        attention_assumed=(
            "no FlashAttention on Volta: attention=math (the unfused softmax) runs at the A100's measured "
            "share of the peak"
        ),
    ),
    "V100-16": GPUSpec(
        "V100 SXM2 16GB",
        {"fp16": 125e12, "fp32": 15.7e12},
        0.9e12,
        15.78,
        0.759,
        "ampere",
        150e9,
        15.75e9,
        80,
        generation="volta",
        nvlink_links=6,
        nic_gbps=100,
        power_w=300,
        sources=(
            "NVIDIA's Tesla V100 data sheet (SXM2: 125 TF fp16 tensor, 15.7 TF fp32, 900 GB/s HBM2, 300 GB/s "
            "NVLink duplex, 300 W, 80 SMs); torch's 15.78 GiB (its OOM message on a V100 16GB); "
            f"{_ZZC} (V100-SXM2-16GB best square fp16 matmul 94.84 TF: 75.9%)"
        ),
        attention_assumed=(
            "no FlashAttention on Volta: attention=math (the unfused softmax) runs at the A100's measured "
            "share of the peak"
        ),
    ),
    "MI300X": GPUSpec(
        "MI300X 192GB",
        _flops(1307e12, 163.4e12, 2.61e15),
        5.3e12,
        191.98,
        0.514,
        "cdna",
        448e9,
        PCIE5,
        304,
        _FP8_CDNA,
        generation="cdna3",
        scale_up="xgmi-mesh",
        nvlink_links=7,
        power_w=750,
        long_run_matmul=_LONG_RUN_MI300X,
        sources=(
            f"{_ML_ENG} (peaks 1307/2610 TF, 192 GB, 5.3 TB/s, MAMF 51.4% bf16 under ROCm 6.3 with TunableOp, "
            "750 W, 304 CUs); stas00/ml-engineering network/README.md @ 744d01e1 (Infinity Fabric: 7 links of 64 "
            f"GB/s per direction, a full mesh); {_AZURE_MI300X} (hipBLASLt fp8 44.4%, 87.5% of it at 16384^3 "
            "after 10,000 warm-ups); torch's 191.98 GiB (its OOM message on an MI300X)"
        ),
        attention_assumed=_MI300X_ATTENTION,
    ),
    "MI325X": GPUSpec(
        "MI325X 256GB",
        _flops(1307e12, 163.4e12, 2.61e15),
        6.0e12,
        255.98,
        0.604,
        "cdna",
        448e9,
        PCIE5,
        304,
        _FP8_CDNA / 0.514 * 0.604,
        generation="cdna3",
        scale_up="xgmi-mesh",
        nvlink_links=7,
        power_w=1000,
        sources=(
            f"{_ML_ENG} (peaks as MI300X's, 256 GB, 6.0 TB/s, MAMF 60.4% bf16 under torch 2.6 + ROCm 6.2.4, "
            "1000 W); Infinity Fabric as MI300X's; fp8 at MI300X's fp8/bf16 ratio and torch's capacity by "
            "MI300X's 0.02 GiB assumed"
        ),
        attention_assumed=_CDNA_ATTENTION,
    ),
    # MI350X: MI355X's silicon at 2200 MHz and 1000 W, every peak scaled by the clock ratio (the
    # accelerator README's note 22).
    "MI350X": GPUSpec(
        "MI350X 288GB",
        _flops(2500e12 * 2200 / 2400, 144.2e12, 5.0e15 * 2200 / 2400, 10.1e15 * 2200 / 2400),
        8.0e12,
        287.98,
        0.626,
        "cdna",
        535.5e9,
        PCIE5,
        256,
        _FP8_CDNA / 0.514 * 0.626,
        fp4_efficiency=None,
        generation="cdna4",
        scale_up="xgmi-mesh",
        nvlink_links=7,
        power_w=1000,
        sources=(
            f"{_ML_ENG} (MI355X's silicon at 2200 MHz: its peaks x 2200/2400, 288 GB, 8 TB/s, 1000 W); MI355X's "
            "MAMF, Infinity Fabric and fp8/bf16 ratio assumed"
        ),
        attention_assumed=_CDNA_ATTENTION,
    ),
    "MI355X": GPUSpec(
        "MI355X 288GB",
        _flops(2500e12, 157.3e12, 5.0e15, 10.1e15),
        8.0e12,
        287.98,
        0.626,
        "cdna",
        535.5e9,
        PCIE5,
        256,
        _FP8_CDNA / 0.514 * 0.626,
        generation="cdna4",
        scale_up="xgmi-mesh",
        nvlink_links=7,
        power_w=1400,
        sources=(
            f"{_ML_ENG} (peaks 2500/5000 TF, fp6 = fp4 = 10100, 288 GB, 8 TB/s, MAMF 1565 TF = 62.6% under "
            "torch 2.8 + ROCm 7.0.2, 1400 W, 256 CUs); stas00/ml-engineering network/README.md @ 744d01e1 "
            "(Infinity Fabric: 7 links of 76.5 GB/s per direction); fp8 at MI300X's fp8/bf16 ratio assumed; no "
            "fp4 matmul measured: precision=fp4 is refused"
        ),
        attention_assumed=_CDNA_ATTENTION,
    ),
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
        generation="ampere",
        scale_up="pcie",
        nic_gbps=200,
        power_w=350,
        sources=f"{_ML_ENG} (peaks, memory); {_ZZC} (best square matmul, 74.4%)",
    ),
    "A10": GPUSpec(
        "A10 24GB",
        _flops(125e12, 31.2e12),
        0.6e12,
        21.99,
        0.448,
        "ampere",
        None,
        PCIE4,
        72,
        generation="ampere",
        scale_up="pcie",
        nic_gbps=200,
        power_w=150,
        sources=f"{_ML_ENG} (peaks, memory); {_ZZC} (best square matmul, 44.8%)",
    ),
    "L4": GPUSpec(
        "L4 24GB",
        _flops(121e12, 30.3e12, 2.42e14),
        0.3e12,
        21.99,
        0.586,
        "ampere",
        None,
        PCIE4,
        58,
        _FP8_RATIO * 0.586,
        generation="ampere",
        scale_up="pcie",
        nic_gbps=200,
        power_w=72,
        sources=f"{_ML_ENG} (peaks, memory); {_ZZC} (best square matmul, 58.6%)",
    ),
}

# Host memory per host of each card's reference system, GiB, and where it comes from. A data sheet's
# "2 TB" of DIMMs is 32 x 64 GB modules, whose capacities are binary: 2048 GiB. Grace's LPDDR5X is
# taken at its decimal "480 GB" (447 GiB), the lower reading.
_DGX_HOPPER = (
    2048.0,
    "host 2 TB DDR5 (DGX H100/H200: NVIDIA DGX BasePOD reference architecture, core components; "
    "mlcommons/inference_results_v4.1 closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json: 32x 64GB)",
)
_DGX_B200 = (2048.0, "host 2 TB in 32 DIMMs, upgradable to 4 TB (NVIDIA DGX B200 user guide, introduction)")
_DGX_A100 = (1024.0, "host 1 TB, upgradable to 2 TB (DGX A100 as announced, May 2020)")
_DGX1 = (512.0, "host 512 GB DDR4-2133 (DGX-1 with V100: anandtech's DGX-2 and DGX-1 table)")
_GRACE_TRAY = (
    2 * 480e9 / GIB,
    "host 2 Grace CPUs of up to 480 GB LPDDR5X each per 4-GPU compute tray (NVIDIA DGX GB200 user guide, "
    "hardware: 2 Grace CPUs and 4 GPUs a tray; GB200 superchip: up to 480 GB LPDDR5X)",
)
_AZURE_MI300X_HOST = (
    1850.0,
    "host 1850 GiB (Azure's ND MI300X v5, 8 MI300X: MicrosoftDocs/azure-docs nd-mi300x-v5-series.md)",
)
_TORCHX_AWS = "meta-pytorch/torchx named_resources_aws.py"


def _assumed(host: tuple[float, str], whose: str) -> tuple[float, str]:
    """`host`'s figure for a card whose own platform publishes none, said so."""
    return host[0], f"host memory assumed the {whose}'s ({host[1].removeprefix('host ')})"


_HOSTS = {
    "H100": _DGX_HOPPER,
    "H100-96": _assumed(_DGX_HOPPER, "DGX H100"),
    "H100 NVL": _assumed(_DGX_HOPPER, "DGX H100"),
    "H100 PCIe": _assumed(_DGX_HOPPER, "DGX H100"),
    "H200": _DGX_HOPPER,
    "H800": _assumed(_DGX_HOPPER, "DGX H100"),
    "H20": _assumed(_DGX_HOPPER, "DGX H100"),
    "B200": _DGX_B200,
    "B300": _assumed(_DGX_B200, "DGX B200"),
    "GB200": _GRACE_TRAY,
    "GB300": _GRACE_TRAY,
    "A100": _DGX_A100,
    "A100-40": _DGX_A100,
    "A800": _assumed(_DGX_A100, "DGX A100"),
    "A100 PCIe": _assumed(_DGX_A100, "DGX A100"),
    "V100-32": _DGX1,
    "V100-16": _DGX1,
    "MI300X": _AZURE_MI300X_HOST,
    "MI325X": _assumed(_AZURE_MI300X_HOST, "ND MI300X v5"),
    "MI350X": _assumed(_AZURE_MI300X_HOST, "ND MI300X v5"),
    "MI355X": _assumed(_AZURE_MI300X_HOST, "ND MI300X v5"),
    "L40S": (1536.0, f"host 1536 GiB (AWS g6e.48xlarge, 8 L40S: {_TORCHX_AWS})"),
    "A10": (768.0, f"host 768 GiB (AWS g5.48xlarge, 8 A10G: {_TORCHX_AWS})"),
    "L4": (768.0, f"host memory assumed the AWS g5.48xlarge's 768 GiB (8 A10G: {_TORCHX_AWS})"),
}
GPUS = {
    key: replace(spec, host_memory_gib=_HOSTS[key][0], sources=f"{spec.sources}; {_HOSTS[key][1]}")
    for key, spec in GPUS.items()
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
    ("a100-80", "A100"),
    ("a100", "A100"),
    ("a800-80", "A800"),
    ("a800", "A800"),
    ("h200-141", "H200"),
    ("h200", "H200"),
    ("h800-80", "H800"),
    ("h800", "H800"),
    ("h20", "H20"),
    ("gb200", "GB200"),
    ("gb300", "GB300"),
    ("b200", "B200"),
    ("b300", "B300"),
    ("h100-80", "H100"),
    ("h100", "H100"),
    ("v100-sxm2-16gb", "V100-16"),
    ("v100-16", "V100-16"),
    ("v100 16", "V100-16"),
    ("v100", "V100-32"),
    ("mi300x", "MI300X"),
    ("mi325x", "MI325X"),
    ("mi350x", "MI350X"),
    ("mi355x", "MI355X"),
    ("l40s", "L40S"),
    ("a10", "A10"),
    ("l4", "L4"),
)


def known_gpus() -> str:
    """The names `gpu=` takes, for a one-line error."""
    return ", ".join(GPUS)


# What torch's and nvidia-smi's names put before the card's ("NVIDIA GB200", "Tesla V100-SXM2-16GB",
# "AMD Instinct MI300X"): `gpu=` takes a name with or without it.
VENDOR_PREFIXES = ("nvidia ", "tesla ", "amd instinct ")


def gpu_named(name: str) -> GPUSpec | None:
    """The card `gpu=` names: a key or an alias as the whole name, in any case, after any vendor prefix;
    None where unknown. Not gpu_spec's fragments: a typo (H1000, B2000) is unknown, not the card it contains."""
    lowered = name.strip().lower()
    for prefix in VENDOR_PREFIXES:
        lowered = lowered.removeprefix(prefix)
    key = next((key for key in GPUS if key.lower() == lowered), None) or dict(ALIASES).get(lowered)
    return GPUS[key] if key is not None else None


def gpu_spec(name: str) -> GPUSpec | None:
    """The spec of a GPU by its key (`gpu=` names), or by (part of) the name torch.cuda.get_device_name
    or a published run gives it; None where unknown."""
    if name in GPUS:
        return GPUS[name]
    lowered = name.strip().lower()
    exact = next((spec for key, spec in GPUS.items() if key.lower() == lowered), None)
    return exact or next((GPUS[key] for fragment, key in ALIASES if fragment in lowered), None)
