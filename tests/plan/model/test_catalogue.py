"""Models by name (harness/plan/model/model_catalogue.json) and Hugging Face config.json files read
offline: the published sizes and parameter counts, the Falcon, Phi-3 and Gemma layouts held to the
model transformers builds, mixture-of-experts configs of families the planner does not read refused,
unknown names answered with the names that exist."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import runner
from harness.plan.model.model_catalogue import catalogue, summary
from harness.plan.model.model_shape import PlanError, shape_of_spec
from tests.helpers import ROOT, env_for_tests

# Llama 3.1 8B's config.json as the hub serves it, provenance and rope settings included.
LLAMA31_8B_FILE = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "rope_type": "llama3", "original_max_position_embeddings": 8192},
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}


def _non_embedding(name: str) -> int:
    s = summary(name)
    d = s.shape.dims
    return s.shape.params - d.vocab * d.width * (1 if s.tied else 2)


@pytest.mark.parametrize("name", list(catalogue()))
def test_every_entry_is_the_shape_its_config_states(name):
    s = summary(name)
    d = s.shape.dims
    assert s.entry.hub and s.entry.paper
    assert d.rms_norm == (s.entry.norm == "RMSNorm")
    assert d.gated_mlp == (s.entry.activation in ("SwiGLU", "GeGLU"))
    if s.entry.preset:
        return
    c = s.entry.config
    assert (d.layers, d.width, d.heads, d.vocab) == (
        c["num_hidden_layers"],
        c["hidden_size"],
        c["num_attention_heads"],
        c["vocab_size"],
    )
    if d.moe is not None:  # a mixture of experts: the experts' width, the dense part's MLP empty
        assert d.ffn_width == 0 and d.moe.expert_ffn == c.get("moe_intermediate_size", c["intermediate_size"])
    else:
        assert d.ffn_width == c.get("intermediate_size", 4 * c["hidden_size"])
    assert s.tied == c["tie_word_embeddings"] and s.max_seq == c["max_position_embeddings"]


@pytest.mark.parametrize(
    "name,published,digits",
    [
        ("gemma-7b", 7_751_248_896, 0),  # Gemma report (arXiv 2403.08295) Table 2, non-embedding
        ("qwen2.5-7b", 6.53e9, 7),  # Qwen/Qwen2.5-7B model card, non-embedding
    ],
)
def test_non_embedding_parameters_are_the_published_count(name, published, digits):
    assert _non_embedding(name) == pytest.approx(published, abs=10**digits / 2)


@pytest.mark.parametrize(
    "name,billions",
    [
        ("llama2-7b", 6.7),  # LLaMA (arXiv 2302.13971) Table 2: the sizes Llama 2 kept
        ("llama2-13b", 13.0),
        ("phi3-mini", 3.8),  # Phi-3 report (arXiv 2404.14219)
    ],
)
def test_parameters_are_the_published_count(name, billions):
    assert round(shape_of_spec(name).params / 1e9, 1) == billions


@pytest.mark.parametrize(
    "spec,kwargs",
    [
        # falcon-7b's layout: multi-query, attention beside the MLP from one norm
        ("hf:FalconConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128)),
        # falcon-40b's: the new decoder, grouped key/value heads, a norm each for attention and MLP
        (
            "hf:falcon",
            dict(
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=8,
                num_kv_heads=2,
                new_decoder_architecture=True,
                vocab_size=128,
            ),
        ),
        # in sequence, with biases, an untied head
        (
            "hf:FalconConfig",
            dict(
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                multi_query=False,
                parallel_attn=False,
                bias=True,
                ffn_hidden_size=96,
                tie_word_embeddings=False,
                vocab_size=128,
            ),
        ),
        (
            "hf:Phi3Config",
            dict(
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=128,
                pad_token_id=0,
            ),
        ),
        (
            "hf:GemmaConfig",
            dict(
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=32,
                vocab_size=128,
            ),
        ),
    ],
)
def test_falcon_phi3_and_gemma_read_offline_are_the_built_models(spec, kwargs):
    from harness.plan.model.model_build import built_shape

    read, built = shape_of_spec(spec, kwargs), built_shape(spec, kwargs, None)
    assert read.tensors == built.tensors  # every tensor, its shape, its block, in the model's order
    assert (read.params, read.flops_params, read.param_modules) == (
        built.params,
        built.flops_params,
        built.param_modules,
    )
    d = read.dims
    assert (d.layers, d.width, d.heads) == (built.dims.layers, built.dims.width, built.dims.heads)
    assert (d.gated_mlp, d.fused_qkv, d.rms_norm) == (built.dims.gated_mlp, built.dims.fused_qkv, built.dims.rms_norm)


def test_falcon_7b_runs_its_attention_with_one_key_value_head_and_says_what_is_approximate():
    falcon = shape_of_spec("falcon-7b")
    assert falcon.dims.kv_heads == 1 and falcon.dims.head_dim == 64 and not falcon.dims.gated_mlp
    assert "parallel_attn" in falcon.note


def test_a_config_json_or_its_directory_is_read_as_the_catalogue_reads_the_same_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31_8B_FILE))
    named = shape_of_spec("llama3.1-8b")
    for ref in (tmp_path, tmp_path / "config.json"):
        read = shape_of_spec(f"hf:{ref}")
        assert (read.tensors, read.dims, read.params) == (named.tensors, named.dims, named.params)
    wider = shape_of_spec(f"hf:{tmp_path}", {"num_hidden_layers": 16})  # model_kwargs over the file
    assert wider.dims.layers == 16


def test_a_plan_of_a_catalogue_name_or_a_config_file_imports_no_torch(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA31_8B_FILE))
    code = (
        "import sys, runner; "
        f"runner.main(['plan', 'model=[llama3.1-70b,hf:{path}]', 'gpus=[8,64]', 'micro_batch=1', 'seq_len=8192']); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env_for_tests()
    )
    assert proc.returncode == 0, proc.stderr
    assert "llama3.1-70b on 64 GPUs: Use " in proc.stdout


@pytest.mark.parametrize(
    "fields,fragment",
    [
        ({"model_type": "deepseek_v2", "n_routed_experts": 160}, "DeepSeek-V2's routing"),
        ({"model_type": "dbrx", "ffn_config": {"moe_num_experts": 16}}, "(ffn_config.moe_num_experts=16)"),
    ],
)
def test_a_mixture_of_experts_config_the_planner_does_not_read_is_one_line(tmp_path, fields, fragment):
    (tmp_path / "config.json").write_text(json.dumps(fields))
    with pytest.raises(PlanError) as err:
        shape_of_spec(f"hf:{tmp_path}")
    message = str(err.value)
    assert "mixture" in message and "MixtralConfig" in message and fragment in message
    assert "\n" not in message


def test_a_mixture_of_experts_config_file_is_read_as_its_config_class():
    fields = {"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 4}
    from_file = shape_of_spec("mixtral-8x7b", {"num_hidden_layers": 4})
    from_class = shape_of_spec("hf:MixtralConfig", {k: v for k, v in fields.items() if k != "model_type"})
    assert from_file.tensors == from_class.tensors and from_file.dims == from_class.dims


def test_a_deepseek_v3_config_file_is_read_as_its_config_class(tmp_path):
    fields = {
        "model_type": "deepseek_v3",
        "n_routed_experts": 16,
        "n_group": 4,
        "topk_group": 2,
        "num_hidden_layers": 4,
    }
    (tmp_path / "config.json").write_text(json.dumps(fields))
    from_file = shape_of_spec(f"hf:{tmp_path}")
    from_class = shape_of_spec("hf:DeepseekV3Config", {k: v for k, v in fields.items() if k != "model_type"})
    assert from_file.tensors == from_class.tensors and from_file.dims == from_class.dims
    assert from_file.dims is not None and from_file.dims.mla is not None


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = runner.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "model,fragments",
    [
        ("llama3-8b", ["unknown model 'llama3-8b': did you mean llama3.1-8b", "qwen2.5-72b", "gpt2-1.5b", "mlp"]),
        ("hf:meta-llama/Llama-3.1-70B", ["no config.json there", "or model=llama3.1-70b from the catalogue"]),
        ("hf:/no/such/config.json", ["no config.json there", "huggingface-cli download"]),
    ],
)
def test_an_unknown_name_or_path_is_one_line_naming_what_exists(capsys, model, fragments):
    code, out, err = _cli(capsys, "plan", f"model={model}")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert all(f in err for f in fragments), err


def test_a_config_file_of_a_type_transformers_does_not_know_is_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-type", "hidden_size": 64}))
    code, _, err = _cli(capsys, "plan", f"model=hf:{tmp_path}")
    assert code == 2 and err.count("\n") == 1 and "model_type 'no-such-type' is not one transformers knows" in err


def test_list_shows_the_catalogue_and_the_docs_give_each_entrys_sources(capsys):
    code, out, _ = _cli(capsys, "list")
    assert code == 0 and "planner catalogue" in out
    docs = (ROOT / "docs" / "planner.md").read_text()
    for name, entry in catalogue().items():
        assert f"  {name} " in out and f"({entry.hub})" in out
        row = next((line for line in docs.splitlines() if line.startswith(f"| `{name}` |")), "")
        assert entry.hub in row, f"docs/planner.md has no row for {name} naming {entry.hub}"
