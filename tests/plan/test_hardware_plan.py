"""The cards people train on in 2026 in the planner: GB200/GB300 NVL72 racks (a 72-GPU NVLink
domain of 4-GPU trays, a Grace host over NVLink-C2C), B300, H800, H20, V100, A800 and AMD's
Instinct cards (Infinity Fabric as a mesh, RCCL): each answers with its own cited figures, and
what a card cannot run is one line."""

from __future__ import annotations

import pytest

import runner
from harness.common.hardware import GPUS, gpu_named, gpu_spec
from harness.plan.model.model_shape import PlanError
from harness.plan.network.fabric import (
    FABRICS,
    Group,
    collective_seconds,
    default_fabric,
    nvls_busbw,
    parse_fabric,
    topology_of,
)
from harness.plan.network.nccl_tuning import bus_bandwidth
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_strategy
from harness.plan.speed.gemm import gemm_tflops
from harness.plan.speed.step_time import host_bytes_per_s

NEW_CARDS = ("GB200", "GB300", "B300", "H800", "H20", "V100-16", "V100-32", "A800", "MI300X", "MI325X", "MI355X")


def run_plan(*args: str, capsys) -> tuple[int, str, str]:
    code = runner.main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "name,key",
    [
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H800", "H800"),
        ("Tesla V100-SXM2-16GB", "V100-16"),
        ("Tesla V100-SXM2-32GB", "V100-32"),
        ("NVIDIA A800-SXM4-80GB", "A800"),
        ("AMD Instinct MI300X", "MI300X"),
        ("GB300", "GB300"),
        ("B200", "B200"),
    ],
)
def test_the_names_torch_and_the_published_runs_give_a_card(name, key):
    assert gpu_spec(name) is GPUS[key]


@pytest.mark.parametrize("card", NEW_CARDS)
def test_every_new_card_cites_its_figures_and_stays_under_its_peaks(card):
    spec = GPUS[card]
    assert spec.sources and spec.power_w
    assert 0.4 < spec.matmul_efficiency < 1 and spec.capacity_gib > 15
    if spec.fp8_efficiency:
        assert spec.peak_flops["fp8"] == pytest.approx(2 * spec.tensor_flops, rel=0.01)
        assert 0.3 < spec.fp8_efficiency < 1


def test_a_bad_card_is_one_line_listing_the_known_ones(capsys):
    code, _, err = run_plan("model=llama3.1-8b", "gpu=GB201", capsys=capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1
    assert all(name in err for name in ("GB200", "GB300", "B300", "H800", "H20", "V100-16", "A800", "MI355X"))


@pytest.mark.parametrize("typo", ["H1000", "H100X", "B2000", "A100-800"])
def test_a_card_name_with_a_known_one_inside_is_not_taken_for_it(typo, capsys):
    # gpu_spec's fragments would read "H1000" as an H100: the user's gpu= must be a whole name.
    code, _, err = run_plan("model=llama3.1-8b", "gpus=8", f"gpu={typo}", capsys=capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1
    assert f"unknown gpu {typo!r}" in err and "MI355X" in err


@pytest.mark.parametrize(
    "name,key",
    [
        ("h100-96", "H100-96"),
        ("a100-40", "A100-40"),
        ("mi300x", "MI300X"),
        ("H800-80", "H800"),
        ("NVIDIA GB200", "GB200"),
        ("Tesla V100-SXM2-16GB", "V100-16"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_gpu_takes_a_key_or_an_alias_as_the_whole_name(name, key):
    assert gpu_named(name) is GPUS[key]


@pytest.mark.parametrize(
    "card,precision,says",
    [
        ("V100-32", "fp8", "no fp8 tensor cores"),
        ("V100-16", "bf16", "no bf16 tensor cores: use fp16"),
        ("A800", "fp8", "no fp8 tensor cores"),
        ("H100", "fp4", "precision=fp4"),
        ("MI300X", "fp4", "precision=fp4"),
    ],
)
def test_a_precision_the_card_cannot_run_is_one_line(card, precision, says, capsys):
    code, _, err = run_plan("model=llama3.1-8b", f"gpu={card}", f"precision={precision}", capsys=capsys)
    assert code != 0 and says in err and len(err.strip().splitlines()) == 1


def test_flash_attention_is_refused_on_volta_and_the_default_is_what_sdpa_runs(capsys):
    """A fused kernel asked for on a V100 is one line; without attention=, each card takes the kernel
    torch's SDPA runs there: the unfused softmax on Volta, cuDNN's on Hopper, FlashAttention-2 on Ampere."""
    code, _, err = run_plan("model=gpt2-350m", "gpu=V100-16", "precision=fp16", "attention=flash", capsys=capsys)
    assert code != 0 and "attention=math" in err
    code, out, _ = run_plan("model=gpt2-350m", "gpu=V100-16", "precision=fp16", capsys=capsys)
    assert code == 0 and "no FlashAttention on Volta" in out and "attention math" in out
    for gpu, kernel in (("H100", "cudnn"), ("A100", "flash")):
        code, out, _ = run_plan("model=gpt2-350m", f"gpu={gpu}", capsys=capsys)
        assert code == 0 and f"attention ({kernel}) by" in out, gpu
    # cuDNN's fp8 attention needs no attention= where cuDNN's kernel is the card's default.
    code, out, _ = run_plan("model=gpt2-350m", "gpu=H100", "precision=fp8", "fp8_attention=true", capsys=capsys)
    assert code == 0 and "fp8 attention" in out


@pytest.mark.parametrize("card", ["A100", "MI300X"])
def test_a_kernel_with_no_rates_on_the_card_is_one_line_naming_the_ones_it_has(card, capsys):
    code, _, err = run_plan("model=gpt2-350m", f"gpu={card}", "attention=cudnn", capsys=capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1
    assert "attention=cudnn" in err and "use one of flash," in err


CUSTOM_CARD = ("gpu=MI400X", "gpu_mem_gb=288", "peak_tflops=2000", "hbm_tb_s=8")


@pytest.mark.parametrize(
    "option, says",
    [
        (
            "attention=flash3",
            "attention=flash3 is built for Hopper's tensor cores, and gpu=MI400X, given by its figures, is not known "
            "to run it: use one of flash, cudnn, flash1, triton, math, fused_softmax, or name a card",
        ),
        (
            "precision=fp4",
            "precision=fp4: gpu=MI400X, given by its figures, has no measured fp4 rate to plan with: give "
            "precision=fp8 with peak_tflops= its dense fp8 peak, or a Blackwell card",
        ),
    ],
)
def test_a_card_given_by_its_figures_is_no_hopper_and_says_what_it_takes(option, says, capsys):
    """Such a card is planned on the H100's efficiencies and Hopper's attention tables; what needs a
    Hopper, or a measured fp4 rate, is one line saying what to give instead."""
    code, _, err = run_plan("model=llama3.1-8b", *CUSTOM_CARD, option, capsys=capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    code, out, err = run_plan("model=llama3.1-8b", *CUSTOM_CARD, "attention=flash", capsys=capsys)
    assert code == 0 and "attention (flash) by" in out, err


@pytest.mark.parametrize(
    "card,own,library",
    [
        ("GB200", ("MAMF 72.9% bf16", "tyche_ngpu72", "72 GPUs on one NVLink domain", "Blackwell"), "NCCL"),
        ("MI300X", ("MAMF 51.4% bf16", "Infinity Fabric", "xgmi 448 GB/s", "as measured on an MI300X"), "RCCL"),
    ],
)
def test_the_405b_question_answers_with_the_cards_own_figures(card, own, library, capsys):
    code, out, _ = run_plan(
        "model=llama3.1-405b",
        f"gpu={card}",
        "gpus=256",
        "seq_len=8192",
        "micro_batch=1",
        "strategies=[fsdp,zero1-tp]",
        capsys=capsys,
    )
    header = out.split("\nstrategy ")[0]
    assert code == 0 and all(figure in header for figure in own) and f"({library})" in header
    card_line = next(line for line in header.splitlines() if line.strip().startswith("card:"))
    assert "H100" not in card_line and "80.3%" not in header  # no H100 MAMF carried over


def test_fp4_runs_the_projections_at_the_cards_nvfp4_rate():
    b200 = GPUS["B200"]
    fp4, fp8 = (gemm_tflops(16384, 16384, 16384, b200, p) for p in ("fp4", "fp8"))
    assert fp4 == pytest.approx(0.92 * b200.fp4_efficiency * 10000, rel=0.05) and fp4 > 1.9 * fp8
    asked = dict(model="llama3.1-8b", gpu="B200", gpus=8, seq_len=8192, micro_batch=2, strategies=["fsdp"])
    speeds = {
        p: plan_strategy("fsdp", question(PlanConfig(**asked, precision=p))).time.tokens_per_s for p in ("fp4", "fp8")
    }
    assert speeds["fp8"] < speeds["fp4"] < 1.6 * speeds["fp8"]  # attention, casts and the rest do not shrink


def test_blackwell_ultra_runs_fp4_at_its_own_dies_measured_rate_not_the_gb200s():
    """A B300's cuBLASLt NVFP4 matmul measured 8333 of its 15000 TFLOP/s; the GB300, the same die with no
    measurement of its own, takes it: half again the GB200's peak, about a tenth over its measured rate."""
    for card in ("B300", "GB300"):
        assert GPUS[card].fp4_efficiency * 15000 == pytest.approx(8333.1)
    assert GPUS["GB200"].fp4_efficiency * 10000 == pytest.approx(7630, rel=0.001)
    ultra, gb200 = (gemm_tflops(16384, 16384, 16384, GPUS[card], "fp4") for card in ("B300", "GB200"))
    assert 1.0 < ultra / gb200 < 1.2


def test_a_gb200_rack_is_one_nvlink_domain_of_four_gpu_trays():
    q = question(PlanConfig(model="llama3.1-8b", gpu="GB200", gpus=144))
    t = q.topology
    assert (t.per_node, t.per_domain, t.domains, t.nodes) == (4, 72, 2, 36)
    assert t.consecutive(8) == Group(8, 1) and t.consecutive(72) == Group(72, 1) and t.consecutive(144).nodes == 2
    h100 = question(PlanConfig(model="llama3.1-8b", gpu="H100", gpus=144)).topology
    assert h100.consecutive(16).nodes == 2  # on 8-GPU nodes the same group crosses the network
    assert (default_fabric(GPUS["GB200"], 4).nics, default_fabric(GPUS["GB200"], 4).gbps) == (4, 400)
    assert question(PlanConfig(model="llama3.1-8b", gpu="GB200", gpus=144, nvlink_domain="nvl36")).topology.domains == 4


@pytest.mark.parametrize(
    "options,says",
    [
        (dict(gpu="MI300X", nvlink_domain=16), "no NVLink switch"),
        (dict(gpu="A100", gpus=16, nvlink_domain=16), "NVLink between hosts comes with rack-scale systems"),
        (dict(gpu="H100", gpus=16, nvlink_domain=16), "NVLink between hosts comes with rack-scale systems"),
        (dict(gpu="GB300", gpus=144, nvlink_domain=144), "largest NVLink domain is 72 GPUs"),
        (dict(gpu="GB200", nvlink_domain="nvl99"), "nvl72"),
        (dict(gpu="GB200", nvlink_domain=6), "multiple of 4"),
        (dict(gpu="GB200", nvlink_domain=0), "give 4, 8 or another positive multiple of 4"),
        (dict(gpu="GB200", interconnect="pcie", nvlink_domain="nvl72"), "PCIe links stay inside a host of 4 GPUs"),
    ],
)
def test_a_bad_nvlink_domain_is_one_line(options, says):
    with pytest.raises(PlanError, match=says):
        question(PlanConfig(model="llama3.1-8b", **{"gpus": 72, **options}))


def test_a_rack_planned_on_pcie_keeps_its_links_inside_each_tray():
    """interconnect=pcie on GB200 trays: no NVLink reaches another tray, so 72 GPUs are 18 hosts whose rings
    cross the network, not one NVLink domain of 72 at PCIe's rate."""
    pcie = question(PlanConfig(model="llama3.1-8b", gpu="GB200", gpus=72, interconnect="pcie")).topology
    assert (pcie.per_domain, pcie.domains) == (4, 18)
    slower = question(PlanConfig(model="llama3.1-8b", gpu="GB200", gpus=72, interconnect="100")).topology
    assert slower.per_domain == 72  # a slower NVLink is still NVLink


def test_tensor_parallel_across_trays_stays_on_nvlink_and_the_recommendation_says_why(capsys):
    described = ["layers=8", "width=12288", "heads=96", "ffn=49152", "vocab=50304", "seq_len=4096", "gpus=144"]
    args = [*described, "strategies=[zero1-tp]", "strategy_options.tp_size=24"]
    code, out, _ = run_plan(*args, "gpu=GB200", capsys=capsys)
    assert code == 0 and "group of 24 GPUs spans 6 hosts but stays on NVLink" in out
    code, _, err = run_plan(*args, "gpu=GB200", "nvlink_domain=nvl36", capsys=capsys)
    assert code != 0 and "splits an NVLink domain's 36 GPUs" in err  # 24 of 36 would straddle two racks


def test_nvls_as_ncclS_own_model_prices_it():
    """NCCL's NVLS all-reduce (tuning.cc nvlsEfficiency, the NVLS search's speeds): Hopper's 8 GPUs
    at 476 GB/s (ml-engineering measured 473-482 on 8 x H200), Blackwell's at 829 (not Hopper's
    1.07 of the link, 963), and below 5 (Hopper) or 7 (Blackwell) GPUs the ring is faster."""
    assert nvls_busbw("hopper", 18, 8) / 1e9 == pytest.approx(476, rel=0.01)
    assert nvls_busbw("blackwell", 18, 8) / 1e9 == pytest.approx(829, rel=0.01)
    assert nvls_busbw("ampere", 12, 8) is None
    ring = {card: 0.8 * 450 if card == "H200" else 680 for card in ("H200", "B200")}
    assert nvls_busbw("hopper", 18, 4) / 1e9 < ring["H200"] < nvls_busbw("hopper", 18, 5) / 1e9
    assert nvls_busbw("blackwell", 18, 6) / 1e9 < ring["B200"] < nvls_busbw("blackwell", 18, 7) / 1e9


def test_an_infinity_fabric_group_has_only_the_links_between_its_gpus():
    mesh = topology_of(GPUS["MI300X"], 8, 1, FABRICS["ndr"])

    def busbw(size: int) -> float:
        group = Group(size, 1)
        return bus_bandwidth("all-reduce", 2**32, collective_seconds(mesh, group, "all-reduce", 2**32), size) / 1e9

    assert busbw(2) == pytest.approx(45.1, rel=0.03)  # one link: ml-engineering measured 47.7
    assert busbw(8) == pytest.approx(315.7, rel=0.03)  # seven: 312.9-316.8 measured
    assert busbw(4) == pytest.approx(3 * 45.1, rel=0.05)
    assert mesh.library == "rccl"


def test_offload_on_a_grace_host_copies_over_nvlink_c2c():
    assert host_bytes_per_s(GPUS["GB200"]) == 201e9 > 3.9 * host_bytes_per_s(GPUS["B200"])
    asked = dict(model="llama3.1-8b", gpus=1, seq_len=4096, micro_batch=1, strategies=["zero3-offload"])
    exposed = {  # on one GPU the only exposed traffic is the host copies
        card: plan_strategy("zero3-offload", question(PlanConfig(**asked, gpu=card))).time.exposed_comm_s
        for card in ("GB200", "B200")
    }
    assert 0 < exposed["GB200"] < exposed["B200"] / 3


def test_the_platform_networks():
    assert parse_fabric("xdr").gbps == 800 and parse_fabric("pollara").kind == "roce"
    assert default_fabric(GPUS["B300"], 8) is FABRICS["xdr"] and default_fabric(GPUS["MI300X"], 8) is FABRICS["ndr"]


def test_a_card_given_by_its_figures_is_named_a_custom_card_on_its_base(capsys):
    # The figures replace the H100's, so the header must not name the H100 nor cite its 700 W and sources.
    code, out, err = run_plan(
        "model=llama3.1-8b", "gpus=8", "gpu_mem_gb=40", "peak_tflops=500", "hbm_tb_s=2", capsys=capsys
    )
    assert code == 0, err
    header, card = out.splitlines()[1], next(line for line in out.splitlines() if line.startswith("  card: "))
    assert "| custom card (40 GB, 500 TFLOP/s bf16, 2 TB/s; the H100 SXM 80GB's other figures) |" in header
    assert "gpu_mem_gb=40, peak_tflops=500, hbm_tb_s=2 as given" in card and "700 W" not in card
    code, out, _ = run_plan("model=llama3.1-8b", *CUSTOM_CARD, capsys=capsys)
    assert code == 0 and "| custom card MI400X (288 GB, 2000 TFLOP/s bf16, 8 TB/s;" in out.splitlines()[1]


def test_a_named_network_of_a_card_per_gpu_has_a_trays_four_on_a_tray():
    def fabric(**asked):
        return question(PlanConfig(model="llama3.1-8b", **asked)).topology.fabric

    # A GB200 tray is 4 GPUs with 4 network cards: xdr there is 4 x 800G, not a DGX B300's 8.
    assert (fabric(gpu="GB200", gpus=16, inter_node="xdr").nics, fabric(gpu="GB200", gpus=16).nics) == (4, 4)
    assert fabric(gpu="GB300", gpus=16, inter_node="spectrum-x").nics == 4
    assert fabric(gpu="H100", gpus=16, nodes=4, inter_node="ndr").nics == 4  # hosts of 4 as nodes= says
    assert fabric(gpu="H100", gpus=2, inter_node="ndr").nics == 8  # a part of one host: the host's cards
    assert fabric(gpu="H100", gpus=16, inter_node="ndr") is FABRICS["ndr"]
    assert fabric(gpu="GB200", gpus=16, inter_node="p5").nics == 32  # a named cluster keeps its own cards


def test_a_collective_across_racks_counts_nvlink_domains_not_nodes(capsys):
    """On GB200 the header's nodes are 4-GPU hosts, and a group's span is the NVLink domains it crosses: a
    reduce-scatter over 4,096 GPUs crosses 57 racks, which is not "57 nodes" beside "1024 hosts x 4 GPUs"."""
    args = ["plan", "model=mixtral-8x7b", "gpus=4096", "gpu=GB200", "seq_len=4096", "strategies=[fsdp-ep,zero3]"]
    assert runner.main(args) == 0
    out = capsys.readouterr().out
    assert "1024 hosts x 4 GPUs" in out and "over 4096 GPUs on 57 NVLink domains" in out
    assert " on 57 nodes" not in out
    assert runner.main(["plan", "model=mixtral-8x7b", "gpus=512", "seq_len=4096", "strategies=[fsdp,zero3]"]) == 0
    assert "over 512 GPUs on 64 nodes" in capsys.readouterr().out  # on H100 a node is its NVLink domain


def test_the_search_names_a_groups_span_in_the_headers_words():
    """The search's losers name a collective's span as the plan's recommendation does (fabric.span_words)."""
    from harness.plan.network.fabric import Group, span_words

    rack = question(PlanConfig(model="mixtral-8x7b", gpus=144, gpu="GB200")).topology
    hosts = question(PlanConfig(model="mixtral-8x7b", gpus=144 - 16)).topology
    assert span_words(Group(144, 2), rack) == "2 NVLink domains"
    assert span_words(Group(128, 16), hosts) == "16 nodes" and span_words(Group(8, 1), hosts) == "1 node"


@pytest.mark.parametrize("ep, racks", [(8, 1), (16, 2), (32, 2)])
def test_an_expert_parallel_group_that_does_not_tile_a_rack_straddles_two(ep, racks):
    """ep groups fill consecutive ranks: 8 tiles an NVL72 rack's 72, while 16 and 32 leave a group over two
    racks (ranks 64-95 of 288), whose all-to-all crosses the network and holds every other group's step."""
    asked = {"model": "deepseek-v3", "gpus": 288, "gpu": "GB200", "strategies": ["fsdp-ep"]}
    q = question(PlanConfig(**asked, strategy_options={"ep_size": ep}))
    assert plan_strategy("fsdp-ep", q).layout.experts.ep_group.nodes == racks


def test_a_strided_group_spans_the_domains_of_its_gpus_not_of_its_stride():
    """The GPUs holding the same experts (edp) are ep apart: 32 of them over 2,048 H800s reach 32 nodes, not
    the 256 nodes their block of 2,048 GPUs spans (a ring of 32 has 32 nodes to span at most)."""
    asked = {"model": "deepseek-v3", "gpus": 2048, "gpu": "H800", "strategies": ["fsdp-ep"], "seq_len": 4096}
    q = question(PlanConfig(**asked, strategy_options={"ep_size": 64}))
    experts = plan_strategy("fsdp-ep", q).layout.experts
    assert (experts.edp_group.size, experts.edp_group.nodes) == (32, 32)


def test_an_expert_parallel_group_across_trays_on_nvlink_is_said_in_the_recommendation(capsys):
    args = [
        "model=deepseek-v3",
        "gpus=576",
        "gpu=GB200",
        "seq_len=4096",
        "batch_size=4608",
        "activation_checkpointing=full",
    ]
    code, out, _ = run_plan(*args, "strategies=[fsdp-ep]", "strategy_options.ep_size=72", capsys=capsys)
    assert code != 0  # 72 does not divide the 256 experts: the rack-wide group must be a power of two here
    code, out, _ = run_plan(*args, "strategies=[fsdp-ep]", "strategy_options.ep_size=8", capsys=capsys)
    assert code == 0 and "stays on NVLink" not in out  # 8 is two trays, as an 8-GPU node would hold it
    code, out, _ = run_plan(
        *args, "nvlink_domain=64", "strategies=[fsdp-ep]", "strategy_options.ep_size=64", capsys=capsys
    )
    assert code == 0 and "expert-parallel all-to-all group of 64 GPUs spans 16 hosts but stays on NVLink" in out


def test_the_header_gives_the_sustained_share_of_each_precision_and_says_whose_it_is(capsys):
    """An fp4 run's 16-bit matmuls (the head, the rest of the model) keep the card's long-run share and its fp4
    projections their own: the header said fp4's 92% for all of them. A card with no long run measured
    takes the H100's settling, which the header now says instead of passing it off as the card's."""
    asked = ["model=llama3.1-8b", "gpus=8", "strategies=[fsdp]"]
    code, out, _ = run_plan(*asked, "gpu=GB200", "precision=fp4", capsys=capsys)
    assert code == 0 and "(the blocks' projections in fp4: up to 76% of 10000, 92% of that sustained), 75% of" in out
    code, out, _ = run_plan(*asked, "gpu=GB300", capsys=capsys)
    assert code == 0 and "92% of that sustained under load (the H100 SXM 80GB's: no long run measured" in out
    code, out, _ = run_plan(*asked, "gpu=GB200", capsys=capsys)
    assert code == 0 and "75% of that sustained under load, attention" in out


def test_a_host_of_more_gpus_than_the_reference_tray_has_as_much_memory_per_gpu(capsys):
    """gpus_per_node=8 of GB200s is two trays' worth of GPUs on one planned host: the reference tray's memory
    (2 Graces, 894 GiB for 4 GPUs) per GPU, not one tray's shared by 8. A host_mem_gb= given is one host's."""
    asked = {"model": "llama3.1-70b", "gpu": "GB200", "gpus": 72, "strategies": ["zero3-offload"]}
    tray = question(PlanConfig(**asked)).host
    eight = question(PlanConfig(**asked, gpus_per_node=8)).host
    assert eight.gpus == 8 and eight.capacity == pytest.approx(2 * tray.capacity)
    given = question(PlanConfig(**asked, gpus_per_node=8, host_mem_gb=1000)).host
    assert given.capacity == pytest.approx(1000e9)
    part = question(PlanConfig(**asked | {"gpus": 8}, nodes=4)).host  # 2 GPUs of each tray: still a tray's memory
    assert part.capacity == pytest.approx(tray.capacity)
    code, out, _ = run_plan("model=llama3.1-70b", "gpu=GB200", "gpus=72", "gpus_per_node=8", capsys=capsys)
    assert code == 0 and "1.7 TiB per 8-GPU host" in out and "reference host of 4 GPUs, as much per GPU: x 2" in out


@pytest.mark.parametrize("cp, racks", [(8, 1), (16, 2)])
def test_a_context_parallel_group_that_does_not_tile_a_rack_straddles_two(cp, racks):
    """cp 16 over 128 GB200s fills ranks 64-79 across the first NVL72 rack's end: its exchange crosses the
    network for that group, which every other waits on; cp 8 tiles the rack."""
    asked = {"model": "llama3.1-70b", "gpus": 128, "gpu": "GB200", "seq_len": 131072, "strategies": ["fsdp-cp"]}
    q = question(PlanConfig(**asked, strategy_options={"cp_size": cp}, activation_checkpointing="full"))
    [group] = {c.group for c in plan_strategy("fsdp-cp", q).collectives if "context parallel" in c.what}
    assert (group.size, group.nodes) == (cp, racks)


def test_an_amd_cards_memory_line_names_its_runtime_and_says_whose_figures_it_takes(capsys):
    """An MI300X's room was 'less 0.5 GiB CUDA context and 1.45 GiB NCCL': on ROCm it is HIP's and RCCL's,
    whose sizes the sources do not measure, so CUDA's and NCCL's are taken and said to be."""
    code, out, _ = run_plan("model=llama3.1-8b", "gpu=MI300X", "gpus=8", "strategies=[fsdp]", capsys=capsys)
    assert code == 0 and "HIP context and 1.45 GiB RCCL (CUDA's and NCCL's figures, assumed)" in out
    assert "CUDA context" not in out
    code, out, _ = run_plan("model=llama3.1-8b", "gpu=H100", "gpus=8", "strategies=[fsdp]", capsys=capsys)
    assert code == 0 and "less 0.5 GiB CUDA context and 1.45 GiB NCCL = " in out


def test_hpzs_copy_may_span_trays_of_an_nvlink_domain():
    """hpZ's secondary copy is gathered inside its group: on NVL72 trays of 4 a group of 8 or 72 stays on
    NVLink (it was refused past one tray), one of 16 straddles two racks and is refused; an 8-GPU node keeps
    its group inside the node."""
    asked = {"model": "llama3.1-70b", "gpu": "GB200", "gpus": 144, "strategies": ["zero3-hpz"]}
    for hpz in (8, 72):
        q = question(PlanConfig(**asked, strategy_options={"zero_hpz_partition_size": hpz}))
        layout = plan_strategy("zero3-hpz", q).layout
        assert (layout.hpz, layout.hpz_group.nodes) == (hpz, 1)
    with pytest.raises(PlanError, match="tile an NVLink domain of 72: use one of 1, 2, 3, 4, 6, 8, 9, 12, 18"):
        q = question(PlanConfig(**asked, strategy_options={"zero_hpz_partition_size": 16}))
        plan_strategy("zero3-hpz", q)
    h100 = {**asked, "gpu": "H100", "gpus": 64, "strategy_options": {"zero_hpz_partition_size": 16}}
    with pytest.raises(PlanError, match="tile a node of 8: use one of 1, 2, 4, 8"):
        plan_strategy("zero3-hpz", question(PlanConfig(**h100)))
