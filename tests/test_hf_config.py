"""Hugging Face config.json files as models: Gemma's head width and GeGLU, Llama-3.1's training
context, folders, study files, and refusals (issue 15). Parameter counts are the published ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hetersim import build
from hetersim.catalog import model_from_hf_config
from hetersim.catalog.models import HF_TRAINING_SEQ_LEN_CAP
from hetersim.terms.flops import embedding_params, layer_params, model_flops_per_token, total_params
from tests.test_cli import assert_user_error, run, run_json

# google/gemma-7b config.json (the keys that matter; hidden_act "gelu", head_dim 256 != 3072/16).
GEMMA_7B = {
    "architectures": ["GemmaForCausalLM"],
    "model_type": "gemma",
    "head_dim": 256,
    "hidden_act": "gelu",
    "hidden_size": 3072,
    "intermediate_size": 24576,
    "max_position_embeddings": 8192,
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 16,
    "rope_scaling": None,
    "vocab_size": 256000,
}
# google/gemma-2b config.json (multi-query: one KV head).
GEMMA_2B = {
    **GEMMA_7B,
    "hidden_size": 2048,
    "intermediate_size": 16384,
    "num_attention_heads": 8,
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
}
# meta-llama/Llama-3.1-8B config.json.
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": False,
    "vocab_size": 128256,
}
# mistralai/Mixtral-8x7B-v0.1 config.json (eight experts per layer, two routed per token).
MIXTRAL = {
    **LLAMA31_8B,
    "model_type": "mixtral",
    "max_position_embeddings": 32768,
    "rope_scaling": None,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
}


def write(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder / "config.json"


def params(entry) -> float:
    return float(total_params(build.model_spec(entry)))


def test_gemma_7b_reads_as_8_54b_parameters(tmp_path):
    """Gemma report (arXiv 2403.08295) Table 2: 7,751,248,896 non-embedding parameters, 786,825,216
    embedding ones (a vocabulary padded to 256,128; the config's 256,000 gives 786,432,000)."""
    entry = model_from_hf_config(write(tmp_path / "gemma-7b", GEMMA_7B))
    m = build.model_spec(entry)
    assert entry["head_dim"] == 256 and entry["mlp"] == "gated" and entry["tied_embeddings"] is True
    non_embedding = float(m.layers * layer_params(m) + m.hidden)  # + the final norm
    assert non_embedding == 7_751_248_896
    assert float(embedding_params(m) - m.hidden) == 256_000 * 3072
    assert params(entry) == pytest.approx(8.54e9, abs=0.005e9)
    # Ignoring head_dim (192 = hidden/heads) and GeGLU (a two-matrix MLP) gives the 6.07B.
    assert params({**entry, "head_dim": None, "mlp": "plain"}) == pytest.approx(6.07e9, abs=0.005e9)


def test_gemma_2b_multi_query(tmp_path):
    """Gemma report Table 2: 1,981,884,416 non-embedding parameters (one KV head of width 256)."""
    m = build.model_spec(model_from_hf_config(write(tmp_path / "gemma-2b", GEMMA_2B)))
    assert float(m.layers * layer_params(m) + m.hidden) == 1_981_884_416


def test_head_width_reaches_the_flops(tmp_path):
    """Model FLOPs per token = 6 x the layer weights (norms aside) + attention 6*s*a*d per layer +
    the LM head: with Gemma's d = 256 every term uses the head width, not hidden/heads."""
    m = build.model_spec(model_from_hf_config(write(tmp_path / "gemma-7b", GEMMA_7B)))
    s = 8192.0
    expected = (
        6.0 * m.layers * (layer_params(m) - 2.0 * m.hidden) + 6.0 * s * 16 * 256 * m.layers + 6.0 * m.vocab * m.hidden
    )
    assert float(model_flops_per_token(m, s)) == pytest.approx(float(expected), rel=1e-6)


def test_llama31_trains_at_its_pretraining_context(tmp_path):
    """Llama-3.1 serves 131,072 tokens but pre-trains at 8,192 (arXiv 2407.21783 Sec. 3.4): the
    config's rope_scaling.original_max_position_embeddings is the training default, and says so."""
    entry = model_from_hf_config(write(tmp_path / "llama31", LLAMA31_8B))
    assert entry["seq_len"] == 8192 and "original_max_position_embeddings" in entry["source"]
    assert params(entry) == 8_030_261_248  # Llama 3.1 8B's published count, 8.03B
    # Without rope_scaling the served context is capped at the training default, and the source says so.
    capped = model_from_hf_config(write(tmp_path / "capped", {**LLAMA31_8B, "rope_scaling": None}))
    assert capped["seq_len"] == HF_TRAINING_SEQ_LEN_CAP and "capped" in capped["source"]


def test_mixtral_is_read_with_its_experts_and_an_unknown_moe_type_refused(tmp_path):
    """Mixtral's 8 experts of 14336 (46.7B parameters, not the 7.2B of one dense FFN); an MoE
    config of a type the importer does not read is refused, never read as dense."""
    from hetersim import build
    from hetersim.terms.flops import total_params

    m = build.model_spec(model_from_hf_config(write(tmp_path / "mixtral", MIXTRAL)))
    assert float(total_params(m)) == pytest.approx(46.7e9, rel=0.01)
    path = write(tmp_path / "jamba", {**MIXTRAL, "model_type": "jamba"})
    with pytest.raises(ValueError, match="num_local_experts = 8: mixture-of-experts model_type 'jamba'") as info:
        model_from_hf_config(path)
    assert str(info.value).startswith(f"config file {path}")
    with pytest.raises(ValueError, match="encoder-decoder|decoder-only"):
        model_from_hf_config(write(tmp_path / "t5", {**LLAMA31_8B, "is_encoder_decoder": True}))


def test_cli_takes_a_folder_and_refuses_what_it_cannot_read(tmp_path):
    write(tmp_path / "gemma-7b", GEMMA_7B)
    base = ["evaluate", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8"]
    out = run_json([*base, "--model", tmp_path / "gemma-7b"])
    assert out["params"] == pytest.approx(8.54e9, abs=0.005e9) and out["plan"]["seq_len"] == 8192
    write(tmp_path / "jamba", {**MIXTRAL, "model_type": "jamba"})
    assert_user_error(run([*base, "--model", tmp_path / "jamba"]), "num_local_experts", "mixture-of-experts")
    (tmp_path / "empty").mkdir()
    assert_user_error(run([*base, "--model", tmp_path / "empty"]), "config.json")
    # A shape its own class refuses (transformers >= 5 validates through huggingface_hub, whose
    # error is no ValueError) or, without that check, the catalog's: one line, never a traceback.
    write(tmp_path / "odd", {**LLAMA31_8B, "hidden_size": 4097})
    assert_user_error(run([*base, "--model", tmp_path / "odd"]), "odd", "4097", "multiple")


def test_a_study_names_a_config_json(tmp_path):
    from dse.study import load_study

    write(tmp_path / "models" / "gemma-7b", GEMMA_7B)
    study = tmp_path / "gemma.toml"
    study.write_text(
        'name = "gemma"\n[model]\nkey = ["models/gemma-7b/config.json", "llama2-7b"]\n'
        '[hardware]\ngpu = "h100-sxm-80gb"\nn_gpus = 8\n[plan]\nglobal_batch = 8\nseq_len = 4096\ntp = [1, 2]\n'
    )
    s = load_study(study)
    assert s.models["models/gemma-7b/config.json"]["head_dim"] == 256
    assert np.isclose(params(s.models["models/gemma-7b/config.json"]), 8.5377e9, rtol=1e-4)


# calculon-ai/calculon models/megatron-1T.json at commit 4f81f029.
CALCULON_1T = {
    "hidden": 25600,
    "feedforward": 102400,
    "seq_size": 2048,
    "attn_heads": 160,
    "attn_size": 160,
    "num_blocks": 128,
}


def test_calculon_model_file_reads_as_megatrons_1t_model(tmp_path):
    """Calculon's megatron-1T.json is the 1T model of Narayanan et al. SC'21 Table 1: 1008.0B
    parameters (biases and the 2048 position embeddings, which the model leaves out, are 0.06B)."""
    from hetersim.catalog import model_from_json

    path = tmp_path / "megatron-1T.json"
    path.write_text(json.dumps(CALCULON_1T))
    entry = model_from_json(path)
    assert (entry["layers"], entry["head_dim"], entry["vocab"], entry["mlp"], entry["seq_len"]) == (
        128,
        160,
        51200,
        "plain",
        2048,
    )
    assert params(entry) == pytest.approx(1008.0e9, abs=0.1e9)
    base = ["evaluate", "--gpu", "h100-sxm-80gb", "--gpus", "512", "--global-batch", "512", "--tp", "8", "--pp", "64"]
    assert run_json([*base, "--model", path])["params"] == params(entry)
    bad = tmp_path / "typo.json"
    bad.write_text(json.dumps({**CALCULON_1T, "feed_forward": 1}))
    assert_user_error(run([*base, "--model", bad]), "typo.json", "unknown key 'feed_forward'")
    moe = tmp_path / "moe.json"
    moe.write_text(json.dumps({**CALCULON_1T, "num_experts": 8}))
    assert_user_error(run([*base, "--model", moe]), "num_experts", "mixture-of-experts")


# --------------------------------------------------------------------------------------------
# transformers.AutoConfig (the `hf` extra) and the reader without it
# --------------------------------------------------------------------------------------------

# openai-community/gpt2 config.json, the keys that set the shape (no n_inner: 4 x n_embd).
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257}
# The same without n_head: a shape the file leaves out is refused, with or without transformers.
GPT2_SHORT = {k: v for k, v in GPT2.items() if k != "n_head"}
# microsoft/Phi-3-mini-4k-instruct's shape, without tie_word_embeddings: Phi3Config's default is
# untied; the plain reader, which knows no default for phi3, assumes tied.
PHI3 = {
    "model_type": "phi3",
    "hidden_act": "silu",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "max_position_embeddings": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "vocab_size": 32064,
}
HF_ID = "meta-llama/Llama-3.1-8B"
EVALUATE_8 = ["evaluate", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8"]


@pytest.fixture
def no_transformers(monkeypatch):
    """As if transformers were not installed (an import of it fails)."""
    monkeypatch.setitem(sys.modules, "transformers", None)


def _shape(entry: dict) -> dict:
    """The entry's model: what sets the cost (a head width of hidden / heads stated or not)."""
    shape = {k: v for k, v in entry.items() if k not in ("source", "name")}
    return {**shape, "head_dim": entry.get("head_dim") or entry["hidden"] // entry["heads"]}


def test_without_transformers_the_plain_reader_reads_what_the_file_says(tmp_path, no_transformers):
    from hetersim.catalog.models import _auto_config

    assert _auto_config() is None
    entry = model_from_hf_config(write(tmp_path / "llama31", LLAMA31_8B))
    assert params(entry) == 8_030_261_248 and "read with transformers" not in entry["source"]
    assert model_from_hf_config(write(tmp_path / "gpt2", GPT2))["ffn_hidden"] == 3072
    # What a file leaves out is not filled from a config class: refused, naming the key.
    with pytest.raises(ValueError, match="missing 'num_attention_heads' or 'n_head'"):
        model_from_hf_config(write(tmp_path / "short", GPT2_SHORT))
    # A model id needs the extra; the message says which.
    line = assert_user_error(run([*EVALUATE_8, "--model", HF_ID]), HF_ID, "hetersim[hf]")
    assert "unknown model" in line


def test_transformers_reads_a_config_as_its_class_does(tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")
    configs = {"gemma-7b": GEMMA_7B, "gemma-2b": GEMMA_2B, "llama31": LLAMA31_8B, "gpt2": GPT2}
    with_class = {name: model_from_hf_config(write(tmp_path / name, c)) for name, c in configs.items()}
    assert all("transformers' config class" in e["source"] for e in with_class.values())
    # The configs the plain reader reads give the same model both ways ...
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "transformers", None)
        plain = {name: model_from_hf_config(tmp_path / name / "config.json") for name in configs}
    assert {n: _shape(e) for n, e in with_class.items()} == {n: _shape(e) for n, e in plain.items()}
    # ... the class's defaults fill what the file leaves out, except the shape ...
    phi3 = model_from_hf_config(write(tmp_path / "phi3", PHI3))
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "transformers", None)
        assert model_from_hf_config(tmp_path / "phi3" / "config.json")["tied_embeddings"] is True
    assert phi3["tied_embeddings"] is False
    assert params(phi3) == pytest.approx(3.82e9, abs=0.005e9)  # Phi-3-mini: 3.8B (arXiv 2404.14219)
    with pytest.raises(ValueError, match="missing 'num_attention_heads' or 'n_head'"):
        model_from_hf_config(write(tmp_path / "short", GPT2_SHORT))


def _hub_cache(root: Path, model_id: str, config: dict) -> Path:
    """A Hugging Face Hub cache (huggingface_hub's layout) holding one model's config.json."""
    repo = root / f"models--{model_id.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    write(repo / "snapshots" / commit, config)
    (root / "version.txt").write_text("1")  # a current cache: transformers 4.x would migrate an unversioned one
    return root


def test_a_model_id_reads_through_autoconfig_from_the_hub_cache(tmp_path):
    pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")
    env = {**os.environ, "HF_HUB_CACHE": str(_hub_cache(tmp_path / "hub", HF_ID, LLAMA31_8B)), "HF_HUB_OFFLINE": "1"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "dse", *EVALUATE_8, *args]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)

    found = cli("--model", HF_ID, "--json")
    assert found.returncode == 0, found.stderr
    out = json.loads(found.stdout)
    assert out["params"] == 8_030_261_248 and out["plan"]["seq_len"] == 8192
    missing = cli("--model", "no-such-org/no-such-model")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    lines = missing.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no-such-org/no-such-model" in lines[0]


# mosaicml/mpt-7b config.json (Hugging Face, transformers 4.28 era): MosaicML's own keys.
MPT_7B = {
    "architectures": ["MPTForCausalLM"],
    "model_type": "mpt",
    "d_model": 4096,
    "n_heads": 32,
    "n_layers": 32,
    "expansion_ratio": 4,
    "max_seq_len": 2048,
    "vocab_size": 50432,
    "no_bias": True,
    "norm_type": "low_precision_layernorm",
    "learned_pos_emb": True,
    "attn_config": {"alibi": True, "attn_impl": "torch", "attn_type": "multihead_attention"},
}


@pytest.mark.parametrize("reader", ["transformers", "plain"])
def test_an_mpt_config_reads_with_mosaicmls_keys(tmp_path, reader, request):
    """MPT-7B (the model card: 6.7B parameters): d_model 4096, 32 heads and layers, a GELU MLP of
    expansion_ratio x d_model, 2048 tokens, the embedding tied to the LM head; read from its own
    keys with or without transformers' MptConfig."""
    if reader == "plain":
        request.getfixturevalue("no_transformers")
    entry = model_from_hf_config(write(tmp_path / "mpt-7b", MPT_7B))
    shape = {k: entry[k] for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "mlp", "seq_len")}
    assert shape == dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=16384, vocab=50432, mlp="plain",
                         seq_len=2048)  # fmt: skip
    assert entry["tied_embeddings"] is True
    # 32 x (4 x 4096^2 attention + 2 x 4096 x 16384 MLP + 2 norms) + 50,432 x 4096 + the final norm.
    assert params(entry) == 32 * (4 * 4096**2 + 2 * 4096 * 16384 + 2 * 4096) + 50432 * 4096 + 4096


def test_experts_in_a_nested_table_and_layers_that_are_not_attention_are_refused(tmp_path):
    """DBRX keeps its experts in ``ffn_config`` (moe_num_experts): refused naming that key, never
    read as a dense model (it has no intermediate_size). A layer_types list with recurrent layers
    (Mamba / linear attention) is refused, while attention kinds pass."""
    dbrx = {
        "architectures": ["DbrxForCausalLM"], "model_type": "dbrx", "d_model": 6144, "n_heads": 48,
        "n_layers": 40, "max_seq_len": 32768, "vocab_size": 100352, "attn_config": {"kv_n_heads": 8},
        "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4},
    }  # fmt: skip
    path = write(tmp_path / "dbrx", dbrx)
    with pytest.raises(ValueError, match=r"ffn_config\.moe_num_experts = 16: mixture-of-experts model_type 'dbrx'"):
        model_from_hf_config(path)
    hybrid = {**LLAMA31_8B, "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
    with pytest.raises(ValueError, match=r"layer_types has 'linear_attention': only attention layers are modelled"):
        model_from_hf_config(write(tmp_path / "hybrid", hybrid))
    sliding = {**LLAMA31_8B, "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]}
    assert model_from_hf_config(write(tmp_path / "sliding", sliding))["layers"] == 2


# mistralai/Mistral-7B-v0.1 config.json: a 4,096-token sliding window in every layer, which
# transformers' MistralModel applies to all layers (one sliding-window mask, no layer_types).
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}


def test_a_window_every_layer_takes_is_read_and_priced(tmp_path):
    """Mistral (and Mixtral, Phi-3, Starcoder2, Qwen3-MoE with use_sliding_window) put the config's
    sliding_window on every layer: read as a window on all of them, not as full attention; a null
    window (Mistral v0.2 and later) or Qwen3-MoE without use_sliding_window is full attention, and a
    window that is no positive integer is refused."""
    entry = model_from_hf_config(write(tmp_path / "v01", MISTRAL_7B_V01))
    assert (entry["sliding_window"], entry["sliding_window_share"]) == (4096, 1.0)
    full = model_from_hf_config(write(tmp_path / "null", {**MISTRAL_7B_V01, "sliding_window": None}))
    assert "sliding_window" not in full
    qwen3_moe = {**MISTRAL_7B_V01, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2}
    qwen3_moe["moe_intermediate_size"] = 1024
    assert "sliding_window" not in model_from_hf_config(write(tmp_path / "q", qwen3_moe))
    on = model_from_hf_config(write(tmp_path / "q_on", {**qwen3_moe, "use_sliding_window": True}))
    assert (on["sliding_window"], on["sliding_window_share"]) == (4096, 1.0)
    with pytest.raises(ValueError, match=r"sliding_window must be a positive integer \(or null\); got 0"):
        model_from_hf_config(write(tmp_path / "zero", {**MISTRAL_7B_V01, "sliding_window": 0}))
    # At 32k tokens the window cuts each query's keys from up to 32,768 to 4,096: less attention.
    args = ["evaluate", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--tp", "8", "--recompute", "selective"]
    long = ["--seq-len", "32768", "--global-batch", "8"]
    windowed = run_json([*args, *long, "--model", str(tmp_path / "v01")])
    dense = run_json([*args, *long, "--model", str(tmp_path / "null")])
    assert windowed["step_time_s"] < 0.8 * dense["step_time_s"]
    short = ["--seq-len", "4096", "--global-batch", "64"]
    same = [run_json([*args, *short, "--model", str(tmp_path / m)])["step_time_s"] for m in ("v01", "null")]
    assert same[0] == pytest.approx(same[1], rel=1e-5)  # a window as long as the sequence: float32 rounding only
