"""Bad model files found by the seventh fuzz (round 7A): a Hugging Face ``config.json`` or a
Calculon model file that was misread, or refused naming hetersim's own field instead of the file's
key. Each case is one line ``error: ...`` naming the file and its key, exit 2, no traceback, as
:mod:`tests.test_bad_input` checks its cases."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from hetersim.catalog import model_from_hf_config
from tests.test_bad_input import check_refused
from tests.test_bad_input_files import FOO  # a type transformers does not know: read as written
from tests.test_hf_config import CALCULON_1T, LLAMA31_8B
from tests.test_moe import DEEPSEEK_V3, GPT_OSS_120B, MIXTRAL, QWEN3_30B

EVAL = ["evaluate", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8", "--model"]
QWEN2_MOE = {
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "num_key_value_heads": 16,
    "vocab_size": 151936,
    "max_position_embeddings": 8192,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "decoder_sparse_step": 1,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}  # fmt: skip  (HF Qwen/Qwen1.5-MoE-A2.7B config.json, the keys that matter)
LLAMA4_TEXT = {
    "model_type": "llama4_text",
    "hidden_size": 5120,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "num_attention_heads": 40,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 202048,
    "max_position_embeddings": 1048576,
    "num_local_experts": 128,
    "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 2,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}  # fmt: skip  (HF meta-llama/Llama-4-Maverick-17B-128E text_config, the keys that matter)
BERT = {
    "model_type": "bert",
    "architectures": ["BertForMaskedLM"],
    "hidden_size": 768,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "intermediate_size": 3072,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
}  # fmt: skip  (HF google-bert/bert-base-uncased config.json)
PYTHIA = {
    "model_type": "gpt_neox",
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_attention_heads": 8,
    "num_hidden_layers": 6,
    "vocab_size": 50304,
    "max_position_embeddings": 2048,
}  # fmt: skip  (HF EleutherAI/pythia-70m config.json, the keys that matter)


def _llama4(**text) -> dict:
    return {"model_type": "llama4", "text_config": {**LLAMA4_TEXT, **text}}


def _rope(scaling: dict, base: dict = FOO) -> dict:
    return {**base, "rope_scaling": scaling}


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}
# The file each case writes, as config.json (or gpt3.json for a Calculon model).
FILES = {
    # hetersim's field was named, not the key the file writes
    "layers-nan": {**FOO, "num_hidden_layers": float("nan")},
    "kv-zero": {**LLAMA31_8B, "num_key_value_heads": 0},
    "maxpos-str": {**FOO, "max_position_embeddings": "4096"},
    "rope-orig-frac": _rope({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 4096.5}),
    "yarn-attention-factor-zero": _rope({**YARN, "attention_factor": 0}),
    "mixtral-topk-zero": {**MIXTRAL, "num_experts_per_tok": 0},
    "llama4-topk-zero": _llama4(num_experts_per_tok=0),
    "qwen2moe-moe-ffn-zero": {**QWEN2_MOE, "moe_intermediate_size": 0},
    "qwen2moe-shared-neg": {**QWEN2_MOE, "shared_expert_intermediate_size": -1},
    "llama4-interleave-neg": _llama4(interleave_moe_layer_step=-1),
    "llama-vocab-zero": {**LLAMA31_8B, "vocab_size": 0},
    "calculon-vocab-str": {**CALCULON_1T, "vocab_size": "50000"},
    # a check across keys named neither the file nor the keys
    "mixtral-topk-above": {**MIXTRAL, "num_experts_per_tok": 9},
    "qwen3moe-topk-above": {**QWEN3_30B, "num_experts_per_tok": 200},
    # transformers' own exception text was the message
    "dsv3-rope-orig-zero": _rope({**YARN, "original_max_position_embeddings": 0}, DEEPSEEK_V3),
    "llama4-interleave-zero": _llama4(interleave_moe_layer_step=0),
    # layer_types not checked against the layers of a type transformers does not know
    "layer-types-short": {**FOO, "sliding_window": 4096, "layer_types": ["sliding_attention"] * 10},
    "layer-types-long": {**FOO, "sliding_window": 4096, "layer_types": ["sliding_attention"] * 80},
    "layer-types-str": {**FOO, "sliding_window": 4096, "layer_types": "sliding_attention"},
    "layer-types-empty": {**FOO, "sliding_window": 4096, "layer_types": []},
    # wrongly typed values were skipped
    "mtp-str": {**DEEPSEEK_V3, "num_nextn_predict_layers": "1"},
    "yarn-factor-str": _rope({**YARN, "factor": "4"}),
    "yarn-factor-neg": _rope({**YARN, "factor": -4.0}, LLAMA31_8B),
    "yarn-mscale-str": _rope({**YARN, "mscale": "1", "mscale_all_dim": 1}, DEEPSEEK_V3),
    "rope-orig-bool": _rope({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": True}),
    # contradictory keys: one was taken
    "gptoss-topk-contradict": {**GPT_OSS_120B, "experts_per_token": 4, "num_experts_per_tok": 8},
    # an MoE model with no MoE layer
    "qwen2moe-step-above": {**QWEN2_MOE, "decoder_sparse_step": 40},
    "llama4-interleave-above": _llama4(interleave_moe_layer_step=100),
    "dsv3-dense-all": {**DEEPSEEK_V3, "first_k_dense_replace": 61},
    # Calculon: a 0 read as the default; the missing key named as a Hugging Face one
    "calculon-kv-zero": {**CALCULON_1T, "kv_heads": 0},
    "calculon-vocab-zero": {**CALCULON_1T, "vocab_size": 0},
    "calculon-maxpos-neg": {**CALCULON_1T, "max_position_embeddings": -5},
    "calculon-rope-theta-str": {**CALCULON_1T, "rope_theta": "abc"},
    "calculon-no-attn-size": {k: v for k, v in CALCULON_1T.items() if k != "attn_size"},
    # an encoder-only model priced as a decoder
    "bert": BERT,
    # the sixteenth fuzz: a typo'd activation, a DeepSeek config without latent attention read as
    # plain attention, an MoE layer step ignored, architectures as one string
    "llama-act-typo": {**LLAMA31_8B, "hidden_act": "swish9"},
    "foo-act-typo": {**FOO, "hidden_act": "SiLu2"},
    "dsv3-kv-lora-zero": {**DEEPSEEK_V3, "kv_lora_rank": 0},
    "dsv3-kv-lora-missing": {k: v for k, v in DEEPSEEK_V3.items() if k != "kv_lora_rank"},
    "dsv3-moe-freq-2": {**DEEPSEEK_V3, "moe_layer_freq": 2},
    "dsv3-moe-freq-0": {**DEEPSEEK_V3, "moe_layer_freq": 0},
    "arch-str": {**LLAMA31_8B, "architectures": "LlamaForCausalLM"},
    # an encoder whose file names no masked-LM head (its base class, or no architectures): priced
    "bert-base-class": {**BERT, "architectures": ["BertModel"]},
    "roberta-no-arch": {k: v for k, v in BERT.items() if k != "architectures"} | {"model_type": "roberta"},
}


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for case, config in FILES.items():
        (tmp_path / case).mkdir()
        name = "gpt3.json" if case.startswith("calculon") else "config.json"
        (tmp_path / case / name).write_text(json.dumps(config))
    return tmp_path


def _model(case: str) -> str:
    return f"{{tmp}}/{case}/{'gpt3.json' if case.startswith('calculon') else 'config.json'}"


CASES = [
    ("layers-nan", ["num_hidden_layers must be a positive integer, got nan"]),
    ("kv-zero", ["num_key_value_heads must be a positive integer, got 0"]),
    ("maxpos-str", ["max_position_embeddings must be a positive integer, got '4096'"]),
    ("rope-orig-frac", ["rope_scaling.original_max_position_embeddings must be a positive integer, got 4096.5"]),
    ("yarn-attention-factor-zero", ["rope_scaling.attention_factor must be a positive number, got 0"]),
    ("mixtral-topk-zero", ["num_experts_per_tok must be a positive integer, got 0"]),
    ("llama4-topk-zero", ["text_config.num_experts_per_tok must be a positive integer, got 0"]),
    ("qwen2moe-moe-ffn-zero", ["moe_intermediate_size must be a positive integer, got 0"]),
    ("qwen2moe-shared-neg", ["shared_expert_intermediate_size must be an integer from 0", "got -1"]),
    ("llama4-interleave-neg", ["text_config.interleave_moe_layer_step must be an integer >= 1; got -1"]),
    ("llama-vocab-zero", ["vocab_size must be a positive integer, got 0"]),
    ("calculon-vocab-str", ["Calculon model file", "vocab_size must be a positive integer, got '50000'"]),
    ("mixtral-topk-above", ["num_experts_per_tok = 9 must be at most num_local_experts = 8"]),
    ("qwen3moe-topk-above", ["num_experts_per_tok = 200 must be at most num_experts = 128"]),
    ("dsv3-rope-orig-zero", ["rope_scaling.original_max_position_embeddings must be a positive integer, got 0"]),
    ("llama4-interleave-zero", ["text_config.interleave_moe_layer_step must be an integer >= 1; got 0"]),
    ("layer-types-short", ["layer_types must list one type per layer (num_hidden_layers = 32); got 10 entries"]),
    ("layer-types-long", ["layer_types must list one type per layer", "got 80 entries"]),
    ("layer-types-str", ["layer_types must list one type per layer", "got 'sliding_attention'"]),
    ("layer-types-empty", ["layer_types must list one type per layer", "got 0 entries"]),
    ("mtp-str", ["num_nextn_predict_layers must be an integer from 0", "got '1'"]),
    ("yarn-factor-str", ["rope_scaling.factor must be a number >= 1", "got '4'"]),
    ("yarn-factor-neg", ["rope_scaling.factor must be a number >= 1", "got -4.0"]),
    ("yarn-mscale-str", ["rope_scaling.mscale must be a number, got '1'"]),
    ("rope-orig-bool", ["rope_scaling.original_max_position_embeddings must be a positive integer, got True"]),
    ("gptoss-topk-contradict", ["num_experts_per_tok = 8, experts_per_token = 4 contradict each other"]),
    ("qwen2moe-step-above", ["decoder_sparse_step = 40 leaves no MoE layer of num_hidden_layers = 24"]),
    ("llama4-interleave-above", ["text_config.interleave_moe_layer_step = 100 leaves no MoE layer", "= 48"]),
    ("dsv3-dense-all", ["first_k_dense_replace = 61 leaves no MoE layer of num_hidden_layers = 61"]),
    ("calculon-kv-zero", ["Calculon model file", "kv_heads must be a positive integer, got 0"]),
    ("calculon-vocab-zero", ["Calculon model file", "vocab_size must be a positive integer, got 0"]),
    ("calculon-maxpos-neg", ["Calculon model file", "max_position_embeddings must be a positive integer, got -5"]),
    ("calculon-rope-theta-str", ["Calculon model file", "rope_theta must be a positive number, got 'abc'"]),
    ("calculon-no-attn-size", ["Calculon model file", "missing 'attn_size'"]),
    ("bert", ["architectures 'BertForMaskedLM' is an encoder", "only decoder-only transformers are modelled"]),
    ("llama-act-typo", ["hidden_act 'swish9' is no activation transformers knows", "silu"]),
    ("foo-act-typo", ["hidden_act 'silu2' is no activation transformers knows"]),
    ("dsv3-kv-lora-zero", ["kv_lora_rank must be a positive integer (deepseek_v3 attends through MLA); got 0"]),
    ("dsv3-kv-lora-missing", ["kv_lora_rank must be a positive integer", "got None"]),
    ("dsv3-moe-freq-2", ["moe_layer_freq = 2: only 1 is read"]),
    ("dsv3-moe-freq-0", ["moe_layer_freq = 0: only 1 is read"]),
    ("arch-str", ["architectures must be a list of class names; got 'LlamaForCausalLM'"]),
    ("bert-base-class", ["model_type 'bert' is an encoder", "only decoder-only transformers are modelled"]),
    ("roberta-no-arch", ["model_type 'roberta' is an encoder", "only decoder-only transformers are modelled"]),
]


@pytest.mark.parametrize("case, fragments", CASES, ids=[c[0] for c in CASES])
def test_a_bad_model_file_is_refused_naming_the_file_and_its_key(tmp, case, fragments):
    line = check_refused(tmp, [*EVAL, _model(case)], [f"{{tmp}}/{case}/", *fragments])
    assert "models." not in line  # never hetersim's own name for the field


@pytest.mark.parametrize("with_transformers", [True, False])
def test_an_encoder_is_refused_by_its_architecture_and_a_bert_decoder_read(tmp_path, monkeypatch, with_transformers):
    """The masked-LM head in ``architectures`` marks the encoder, with or without transformers; a
    BERT made a decoder (``is_decoder``, BertLMHeadModel) is read. A decoder-only class that has
    an ``is_decoder`` switch (GPTNeoXConfig: False) is no encoder, so that switch decides nothing."""
    if not with_transformers:
        monkeypatch.setitem(sys.modules, "transformers", None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(BERT))
    with pytest.raises(ValueError, match="architectures 'BertForMaskedLM' is an encoder"):
        model_from_hf_config(path)
    path.write_text(json.dumps({**BERT, "is_decoder": True}))
    assert model_from_hf_config(path)["layers"] == 12
    path.write_text(json.dumps({**PYTHIA, "architectures": ["GPTNeoXForCausalLM"]}))
    assert model_from_hf_config(path)["layers"] == 6


def test_transformers_log_lines_never_join_the_error_line(tmp_path):
    """A vocabulary of 0 made transformers log two ``bos_token_id``/``eos_token_id`` warnings
    before the error line: a fresh process shows what a user sees."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA31_8B, "vocab_size": 0}))
    env = {**os.environ, "HETERSIM_CACHE_DIR": "off"}
    args = [sys.executable, "-m", "dse", *EVAL, str(path)]
    out = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: config file {path}: vocab_size must be a positive integer, got 0"
    ]


def test_the_fixed_keys_still_read_real_configs(tmp_path):
    """The published configs these cases change are read as before: an MoE step within the layers,
    both GPT-OSS top-k keys agreeing, YaRN numbers that are numbers."""
    for name, config in {"qwen2moe": QWEN2_MOE, "llama4": _llama4(), "gptoss": GPT_OSS_120B}.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(config))
        entry = model_from_hf_config(path)
        assert entry["n_experts"] > 1 and entry["top_k"] >= 1, name
    assert entry["rope_attention_scale"] == pytest.approx(0.1 * math.log(32.0) + 1.0)


def test_deepseeks_own_moe_layer_freq_of_one_and_a_known_activation_read_as_before(tmp_path):
    """DeepSeek-V3's released config.json writes ``moe_layer_freq: 1`` (every layer after the
    dense ones is MoE): read as the file without it; Gemma's GeLU activation is one transformers
    knows."""

    def read(config: dict, name: str) -> dict:
        (tmp_path / name).write_text(json.dumps(config))
        return model_from_hf_config(tmp_path / name)

    plain = read(DEEPSEEK_V3, "a.json")
    with_freq = read({**DEEPSEEK_V3, "moe_layer_freq": 1}, "b.json")
    assert {k: v for k, v in with_freq.items() if k != "source"} == {k: v for k, v in plain.items() if k != "source"}
    assert plain["kv_lora_rank"] == DEEPSEEK_V3["kv_lora_rank"]
    assert read({**LLAMA31_8B, "hidden_act": "gelu_pytorch_tanh"}, "c.json")["mlp"] == "gated"
