"""Contract tests for the catalog: every entry passes the same checks, and bad input fails clearly."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetersim.catalog import (
    CATALOG_DIR,
    SECTIONS,
    Catalog,
    apply_overrides,
    fields,
    llama_ffn_hidden,
    load_catalog,
    model_from_dims,
    model_from_hf_config,
    numeric_fields,
)

CATALOG = load_catalog()
ENTRIES = [(section, key) for section in SECTIONS for key in CATALOG.section(section)]
ENTRY_IDS = [f"{section}:{key}" for section, key in ENTRIES]

REQUIRED_KEYS = {
    "gpus": {
        "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h100-96gb-500w", "h200-sxm-141gb",
        "b200", "gb200", "gb300", "mi300x", "v100-sxm-32gb",
    },
    "links": {
        "nvlink2", "nvlink3", "nvlink4", "nvlink5", "xgmi-mi300x", "pcie3", "pcie4", "pcie5",
        "pcie6", "ib-hdr", "ib-ndr", "ib-xdr", "roce-400", "efa-400",
    },
    "models": {
        "llama-7b", "llama-13b", "llama-33b", "llama-65b", "llama2-7b", "llama2-13b", "llama2-70b",
        "llama3-8b", "llama3-70b", "llama3-405b", "llama3.1-8b", "llama3.1-70b", "llama3.1-405b",
        "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b", "gpt3-5b", "gpt3-20b",
        "nemotron-340b", "nemotron-8b", "nemotron-22b", "mt-nlg-530b",
    },
    "memory": {
        "ddr5-4800-channel", "ddr5-5600-channel", "micron-cz120", "samsung-cmm-d-cxl2",
        "samsung-cmm-d-cxl31", "samsung-cmm-b-pool", "cxl2-switch", "cxl3-switch",
    },
    "fleets": {"meta-llama3-h100"},
}  # fmt: skip

# Numeric fields that may be 0: an unsupported precision, or a switch that holds no memory.
ZERO_ALLOWED = {
    ("gpus", "peak_tflops_bf16"),
    ("gpus", "peak_tflops_fp16"),
    ("gpus", "peak_tflops_fp8"),
    ("gpus", "peak_tflops_fp32"),
    ("gpus", "gemm_eff_fp8"),
    ("memory", "capacity_GiB"),
    # Interruption counts by cause: a cause may have none (their sum must be positive).
    *(("fleets", f"interruptions_{c}") for c in ("gpu", "host", "network", "software", "maintenance", "unknown")),
    ("fleets", "straggler_node_frac"),
    ("fleets", "straggler_slowdown"),
}

H200_KEY = "h200-sxm-141gb"


def write(tmp_path: Path, text: str, name: str = "extra.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_error(path: Path) -> str:
    with pytest.raises(ValueError) as info:
        load_catalog([path])
    message = str(info.value)
    assert "\n" not in message, "errors must be one line"
    assert str(path) in message, "errors must name the file"
    return message


# ---------------------------------------------------------------------------------------------
# Contract: every packaged entry
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("section", SECTIONS)
def test_required_keys_present(section):
    assert REQUIRED_KEYS[section] <= set(CATALOG.section(section))


@pytest.mark.parametrize(("section", "key"), ENTRIES, ids=ENTRY_IDS)
def test_required_fields_present(section, key):
    entry = CATALOG.section(section)[key]
    assert [name for name in fields(section) if name not in entry] == []


@pytest.mark.parametrize(("section", "key"), ENTRIES, ids=ENTRY_IDS)
def test_numbers_positive(section, key):
    entry = CATALOG.section(section)[key]
    for name in numeric_fields(section):
        if name not in entry:
            continue
        if (section, name) in ZERO_ALLOWED:
            assert entry[name] >= 0, name
        else:
            assert entry[name] > 0, name


@pytest.mark.parametrize(("section", "key"), ENTRIES, ids=ENTRY_IDS)
def test_every_number_has_a_source(section, key):
    entry = CATALOG.section(section)[key]
    if section == "models":
        assert entry["source"].strip()
        return
    sources = entry["sources"]
    missing = [name for name in numeric_fields(section) if name in entry and not sources.get(name, "").strip()]
    assert missing == []


@pytest.mark.parametrize("key", sorted(CATALOG.gpus))
def test_prices_are_labelled_estimates(key):
    sources = CATALOG.gpus[key]["sources"]
    for name in ("price_usd", "price_usd_per_hour"):
        assert sources[name].startswith("estimate"), name


@pytest.mark.parametrize("key", sorted(CATALOG.gpus))
def test_gpu_references_resolve_to_links_of_the_right_kind(key):
    gpu = CATALOG.gpu(key)
    for name, kind in (("scaleup_link", "scaleup"), ("host_link", "host"), ("nic", "scaleout")):
        assert CATALOG.link(gpu[name])["kind"] == kind, name


@pytest.mark.parametrize("key", sorted(CATALOG.gpus))
def test_gpu_precision_support_is_consistent(key):
    gpu = CATALOG.gpu(key)
    assert gpu["peak_tflops_bf16"] > 0 or gpu["peak_tflops_fp16"] > 0
    assert (gpu["gemm_eff_fp8"] > 0) == (gpu["peak_tflops_fp8"] > 0)
    assert 0 < gpu["gemm_eff_bf16"] <= 1


@pytest.mark.parametrize("key", sorted(CATALOG.memory))
def test_memory_links_resolve(key):
    link = CATALOG.memory_device(key)["link"]
    if link:
        assert CATALOG.link(link)["kind"] == "host"


@pytest.mark.parametrize("key", sorted(CATALOG.models))
def test_model_shapes(key):
    model = CATALOG.model(key)
    assert model["heads"] % model["kv_heads"] == 0
    assert model["hidden"] % model["heads"] == 0
    assert model["mlp"] in ("gated", "plain")


def test_every_published_run_gpu_is_in_the_catalog():
    runs = Path(__file__).resolve().parents[1] / "hetersim" / "data" / "published_runs.csv"
    with runs.open(newline="") as handle:
        gpus = {row["gpu"].strip() for row in csv.DictReader(handle)}
    assert gpus <= set(CATALOG.gpus)


def test_packaged_files_exist():
    for name in ("accelerators.toml", "links.toml", "models.toml", "memory.toml", "README.md"):
        assert (CATALOG_DIR / name).is_file(), name


@pytest.mark.parametrize(
    ("method", "kind"),
    [("gpu", "gpu"), ("link", "link"), ("model", "model"), ("memory_device", "memory device")],
)
def test_unknown_key_lists_known_keys(method, kind):
    with pytest.raises(ValueError, match=rf"^unknown {kind} 'xyz'; known: \S"):
        getattr(CATALOG, method)("xyz")


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("A100 40GB", "a100-sxm-40gb"),  # spaces for hyphens
        ("A100_80GB", "a100-sxm-80gb"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"),  # torch.cuda.get_device_name
        ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
        ("Tesla V100-SXM2-32GB", "v100-sxm-32gb"),
        ("AMD Instinct MI300X", "mi300x"),
        ("Gaudi 2", "gaudi2"),
    ],
)
def test_device_names_as_tools_print_them_resolve(name, key):
    assert CATALOG.gpu(name) == CATALOG.gpu(key)


def test_loose_names_are_unambiguous_and_never_guess(tmp_path):
    from hetersim.catalog.load import _loose

    for section in SECTIONS:  # no two packaged entries share a name once separators are dropped
        owner: dict[str, str] = {}
        for key, entry in CATALOG.section(section).items():
            for name in [key, *(a.strip() for a in str(entry.get("aliases", "")).split(",") if a.strip())]:
                assert owner.setdefault(_loose(name), key) == key, (section, name, owner[_loose(name)])
    # A device the catalog does not have is not matched to a near one.
    with pytest.raises(ValueError, match="unknown gpu 'A100 80GB PCIe'"):
        CATALOG.gpu("A100 80GB PCIe")
    # Two user entries that differ only in separators: a loose name is an error naming both.
    gpu = dict(CATALOG.gpu(H200_KEY))
    del gpu["sources"]
    body = "\n".join(f"{name} = {json.dumps(value)}" for name, value in gpu.items())
    path = write(tmp_path, f"[gpus.x-1]\n{body}\n[gpus.x_1]\n{body}\n")
    with pytest.raises(ValueError, match="gpu 'X 1' is ambiguous: it names x-1, x_1"):
        load_catalog([path]).gpu("X 1")


def test_lookup_returns_a_copy():
    CATALOG.gpu(H200_KEY)["hbm_bw_GBps"] = -1.0
    assert CATALOG.gpu(H200_KEY)["hbm_bw_GBps"] == 4800.0


def test_catalog_is_frozen():
    with pytest.raises(AttributeError):
        CATALOG.gpus = {}  # type: ignore[misc]
    assert isinstance(CATALOG, Catalog)


# ---------------------------------------------------------------------------------------------
# Extra files: add and override
# ---------------------------------------------------------------------------------------------


def test_override_merges_one_field(tmp_path):
    path = write(tmp_path, f"[gpus.{H200_KEY}]\nhbm_bw_GBps = 9600\n")
    catalog = load_catalog([path])
    gpu = catalog.gpu(H200_KEY)
    assert gpu["hbm_bw_GBps"] == 9600.0
    assert gpu["hbm_capacity_GiB"] == CATALOG.gpu(H200_KEY)["hbm_capacity_GiB"]
    assert str(path) in gpu["sources"]["hbm_bw_GBps"]
    assert gpu["sources"]["tdp_W"] == CATALOG.gpu(H200_KEY)["sources"]["tdp_W"]


def test_override_keeps_a_given_source(tmp_path):
    text = f'[gpus.{H200_KEY}]\nprice_usd_per_hour = 3.5\n[gpus.{H200_KEY}.sources]\nprice_usd_per_hour = "quote"\n'
    gpu = load_catalog([write(tmp_path, text)]).gpu(H200_KEY)
    assert (gpu["price_usd_per_hour"], gpu["sources"]["price_usd_per_hour"]) == (3.5, "quote")


def test_later_files_win(tmp_path):
    first = write(tmp_path, "[links.nvlink4]\nbusbw_eff = 0.5\n", "a.toml")
    second = write(tmp_path, "[links.nvlink4]\nbusbw_eff = 0.9\n", "b.toml")
    assert load_catalog([first, second]).link("nvlink4")["busbw_eff"] == 0.9


def test_new_link_and_gpu_using_it(tmp_path):
    gpu = dict(CATALOG.gpu(H200_KEY), nic="roce-800", name="H200 on 800G")
    del gpu["sources"]
    lines = ["[links.roce-800]", 'name = "RoCE 800"', 'kind = "scaleout"', "bw_GBps = 100.0"]
    lines += ["latency_us = 14.0", "busbw_eff = 0.73", "[gpus.h200-roce800]"]
    lines += [f"{name} = {json.dumps(value)}" for name, value in gpu.items()]
    catalog = load_catalog([write(tmp_path, "\n".join(lines) + "\n")])
    assert catalog.gpu("h200-roce800")["nic"] == "roce-800"
    assert catalog.link("roce-800")["bw_GBps"] == 100.0


def test_new_model_from_file(tmp_path):
    text = (
        '[models.tiny]\nname = "tiny"\nlayers = 2\nhidden = 256\nheads = 4\nkv_heads = 2\n'
        'ffn_hidden = 768\nvocab = 1000\nmlp = "gated"\nseq_len = 512\ntied_embeddings = true\n'
    )
    model = load_catalog([write(tmp_path, text)]).model("tiny")
    assert (model["layers"], model["kv_heads"], model["tied_embeddings"]) == (2, 2, True)


def test_packaged_catalog_untouched_by_extra_files(tmp_path):
    load_catalog([write(tmp_path, f"[gpus.{H200_KEY}]\nhbm_bw_GBps = 9600\n")])
    assert load_catalog().gpu(H200_KEY)["hbm_bw_GBps"] == 4800.0


# ---------------------------------------------------------------------------------------------
# Bad files
# ---------------------------------------------------------------------------------------------


def test_unknown_field(tmp_path):
    message = load_error(write(tmp_path, f"[gpus.{H200_KEY}]\nhbm_bandwidth = 9600\n"))
    assert f"gpus.{H200_KEY} has unknown field 'hbm_bandwidth'; allowed: name, vendor" in message


def test_negative_number(tmp_path):
    path = write(tmp_path, f"[gpus.{H200_KEY}]\nhbm_bw_GBps = -3\n")
    message = load_error(path)
    assert message == f"catalog file {path}: gpus.{H200_KEY}.hbm_bw_GBps must be a positive number, got -3"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[gpus.b200]\nscaleup_domain = 7.5\n", "gpus.b200.scaleup_domain must be a positive integer, got 7.5"),
        ("[gpus.b200]\ngemm_eff_bf16 = 1.5\n", "gpus.b200.gemm_eff_bf16 must be a number in (0, 1], got 1.5"),
        ('[gpus.b200]\ntdp_W = "1000"\n', "gpus.b200.tdp_W must be a positive number, got '1000'"),
        ("[gpus.b200]\ntdp_W = true\n", "gpus.b200.tdp_W must be a positive number, got True"),
        ('[links.pcie5]\nkind = "fabric"\n', "links.pcie5.kind must be 'scaleup' or 'host' or 'scaleout'"),
        ('[models.llama3-8b]\nmlp = "swiglu"\n', "models.llama3-8b.mlp must be 'gated' or 'plain', got 'swiglu'"),
        ("[models.llama3-8b]\nkv_heads = 5\n", "models.llama3-8b.kv_heads must divide heads (32), got 5"),
        ("[models.llama3-8b]\nhidden = 4100\n", "models.llama3-8b.hidden must be a multiple of heads (32)"),
        ("[gpus.b200]\ngemm_eff_fp8 = 0.0\n", "gpus.b200.gemm_eff_fp8 must be > 0 exactly when peak_tflops_fp8 > 0"),
        ("[memory.cxl2-switch]\ncapacity_GiB = 64\n", "memory.cxl2-switch.capacity_GiB must be 0 for a cxl-switch"),
        ('[gpus.b200.sources]\nhbm = "x"\n', "gpus.b200.sources has unknown field 'hbm'"),
        ("[gpus]\nb200 = 3\n", "gpus.b200 must be a table of fields, got 3"),
        ("[accelerators.b200]\ntdp_W = 1\n", "unknown section 'accelerators'; allowed: gpus, links, models, memory"),
    ],
)
def test_bad_values(tmp_path, text, expected):
    assert expected in load_error(write(tmp_path, text))


def test_malformed_toml(tmp_path):
    message = load_error(write(tmp_path, "[gpus.b200\ntdp_W = 1\n"))
    assert "invalid TOML" in message


def test_missing_file(tmp_path):
    assert "not found" in load_error(tmp_path / "nope.toml")


def test_a_new_gpu_needs_no_capex_price(tmp_path):
    entry = {k: v for k, v in CATALOG.gpu("h100-sxm-80gb").items() if k not in ("price_usd", "sources", "aliases")}
    lines = ["[gpus.no-capex]"] + [f"{k} = {json.dumps(v)}" for k, v in entry.items()]
    gpu = load_catalog([write(tmp_path, "\n".join(lines) + "\n")]).gpu("no-capex")
    assert "price_usd" not in gpu and gpu["price_usd_per_hour"] == entry["price_usd_per_hour"]


def test_new_entry_missing_fields(tmp_path):
    message = load_error(write(tmp_path, '[gpus.new-gpu]\nname = "New"\nvendor = "X"\n'))
    assert "new entry gpus.new-gpu is missing required fields: peak_tflops_bf16, peak_tflops_fp16" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[gpus.b200]\nnic = "ib-zzz"\n', "gpus.b200.nic = 'ib-zzz' is not a known link; known: "),
        (
            '[gpus.b200]\nnic = "nvlink4"\n',
            "gpus.b200.nic = 'nvlink4' must name a scaleout link; links.nvlink4 is a scaleup link",
        ),
        ('[memory.micron-cz120]\nlink = "cxl9-x8"\n', "memory.micron-cz120.link = 'cxl9-x8' is not a known link"),
    ],
)
def test_unknown_reference(tmp_path, text, expected):
    assert expected in load_error(write(tmp_path, text))


def test_reference_to_a_link_from_a_later_file(tmp_path):
    uses = write(tmp_path, '[gpus.b200]\nnic = "ib-new"\n', "a.toml")
    defines = write(
        tmp_path,
        '[links.ib-new]\nname = "new"\nkind = "scaleout"\nbw_GBps = 1.0\nlatency_us = 1.0\nbusbw_eff = 0.5\n',
        "b.toml",
    )
    assert load_catalog([uses, defines]).gpu("b200")["nic"] == "ib-new"


# ---------------------------------------------------------------------------------------------
# apply_overrides (CLI --set, study files)
# ---------------------------------------------------------------------------------------------


def test_apply_overrides_parses_text_and_cites_origin():
    entry = CATALOG.gpu(H200_KEY)
    out = apply_overrides("gpus", H200_KEY, entry, {"hbm_bw_GBps": "9600", "scaleup_domain": "72"}, origin="--set")
    assert (out["hbm_bw_GBps"], out["scaleup_domain"]) == (9600.0, 72)
    assert out["sources"]["hbm_bw_GBps"] == "override from --set"
    assert entry["hbm_bw_GBps"] == 4800.0, "the input entry must not change"


def test_apply_overrides_on_a_model():
    out = apply_overrides("models", "llama3-8b", CATALOG.model("llama3-8b"), {"seq_len": 131072})
    assert out["seq_len"] == 131072
    assert out["source"].endswith("override from apply_overrides")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"hbm_bw_GBps": -3}, "apply_overrides: gpus.h200-sxm-141gb.hbm_bw_GBps must be a positive number, got -3"),
        ({"hbm_bw_GBps": "fast"}, "hbm_bw_GBps must be a positive number, got 'fast'"),
        ({"hbm_bandwidth": 1}, "has unknown field 'hbm_bandwidth'; allowed: "),
        ({"peak_tflops_fp8": 0}, "gemm_eff_fp8 must be > 0 exactly when peak_tflops_fp8 > 0"),
        ({"nic": "nvlink4"}, "nic = 'nvlink4' must name a scaleout link"),
        ({"sources": "x"}, "gpus.h200-sxm-141gb.sources cannot be set by an override"),
    ],
)
def test_apply_overrides_rejects(overrides, expected):
    with pytest.raises(ValueError) as info:
        apply_overrides("gpus", H200_KEY, CATALOG.gpu(H200_KEY), overrides, catalog=CATALOG)
    assert expected in str(info.value)


def test_apply_overrides_unknown_section():
    with pytest.raises(ValueError, match="unknown catalog section 'gpu'"):
        apply_overrides("gpu", H200_KEY, CATALOG.gpu(H200_KEY), {})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Hugging Face configs and models by dimensions
# ---------------------------------------------------------------------------------------------

LLAMA3_8B_CONFIG = {
    "_name_or_path": "meta-llama/Meta-Llama-3-8B",
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}

GPT2_CONFIG = {
    "model_type": "gpt2",
    "activation_function": "gelu_new",
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_inner": None,
    "n_positions": 1024,
    "vocab_size": 50257,
}


def write_config(tmp_path: Path, config: dict) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_hf_llama_config_matches_catalog(tmp_path):
    model = model_from_hf_config(write_config(tmp_path, LLAMA3_8B_CONFIG))
    expected = CATALOG.model("llama3-8b")
    for name in fields("models"):
        if name != "name":
            assert model[name] == expected[name], name
    assert model["name"] == "meta-llama/Meta-Llama-3-8B"


def test_hf_config_defaults_kv_heads_to_heads(tmp_path):
    config = {k: v for k, v in LLAMA3_8B_CONFIG.items() if k not in ("num_key_value_heads", "tie_word_embeddings")}
    model = model_from_hf_config(write_config(tmp_path, config))
    assert (model["kv_heads"], model["tied_embeddings"]) == (32, False)


def test_hf_gpt2_config(tmp_path):
    model = model_from_hf_config(write_config(tmp_path, GPT2_CONFIG))
    assert model == {
        "name": "model",
        "layers": 12,
        "hidden": 768,
        "heads": 12,
        "kv_heads": 12,
        "ffn_hidden": 3072,
        "vocab": 50257,
        "mlp": "plain",
        "seq_len": 1024,
        "tied_embeddings": True,
        "source": f"Hugging Face config {tmp_path / 'model' / 'config.json'}{_read_with()}; "
        f"seq_len 1024 from {'max_position_embeddings' if _read_with() else 'n_positions'}",
    }


def _read_with() -> str:
    """How a config.json is read here: with transformers' config class where it is installed."""
    from hetersim.catalog.models import _auto_config

    return " (read with transformers' config class)" if _auto_config() is not None else ""


@pytest.mark.parametrize(
    ("drop", "expected"),
    [("hidden_size", "missing 'hidden_size' or 'n_embd'"), ("intermediate_size", "missing 'intermediate_size'")],
)
def test_hf_config_missing_key(tmp_path, drop, expected):
    path = write_config(tmp_path, {k: v for k, v in LLAMA3_8B_CONFIG.items() if k != drop})
    with pytest.raises(ValueError) as info:
        model_from_hf_config(path)
    assert str(info.value).startswith(f"config file {path}: {expected}")


def test_hf_config_bad_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON") as info:
        model_from_hf_config(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("key", ["llama-7b", "llama-13b", "llama-33b", "llama-65b"])
def test_llama_ffn_rule_reproduces_llama(key):
    model = CATALOG.model(key)
    built = model_from_dims(model["layers"], model["hidden"], model["heads"])
    assert built["ffn_hidden"] == model["ffn_hidden"]


def test_model_from_dims_defaults():
    plain = model_from_dims(24, 2048, 16, mlp="plain")
    assert (plain["ffn_hidden"], plain["kv_heads"], plain["mlp"]) == (8192, 16, "plain")
    gqa = model_from_dims(80, 8192, 64, kv_heads=8, ffn_hidden=28672, vocab=128256, seq_len=8192)
    assert (gqa["kv_heads"], gqa["ffn_hidden"], gqa["vocab"], gqa["seq_len"]) == (8, 28672, 128256, 8192)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"kv_heads": 5}, "kv_heads must divide heads (32), got 5"),
        ({"mlp": "swiglu"}, "mlp must be 'gated' or 'plain'"),
        ({"seq_len": 0}, "seq_len must be a positive integer, got 0"),
    ],
)
def test_model_from_dims_rejects(kwargs, expected):
    with pytest.raises(ValueError, match="^model_from_dims: ") as info:
        model_from_dims(32, 4096, 32, **kwargs)
    assert expected in str(info.value)


@given(st.integers(min_value=1, max_value=1024).map(lambda n: 64 * n))
def test_llama_ffn_rule_properties(hidden):
    ffn = llama_ffn_hidden(hidden)
    assert ffn % 256 == 0
    assert 3 * ffn >= 8 * hidden > 3 * (ffn - 256)


def test_gpu_is_found_by_alias_or_case(tmp_path):
    path = write(tmp_path, f'[gpus.{H200_KEY}]\naliases = "H200, h200-141gb"\n')
    catalog = load_catalog([path])
    for name in ("h200", "H200", "h200-141GB", H200_KEY.upper()):
        assert catalog.gpu(name)["hbm_capacity_GiB"] == catalog.gpu(H200_KEY)["hbm_capacity_GiB"]
    with pytest.raises(ValueError, match="unknown gpu 'h300'"):
        catalog.gpu("h300")


def test_packaged_aliases_are_unambiguous():
    names = {}
    for key, entry in CATALOG.gpus.items():
        for name in [key] + [a.strip() for a in entry.get("aliases", "").split(",") if a.strip()]:
            assert name.lower() not in names, (name, key, names.get(name.lower()))
            names[name.lower()] = key
    assert CATALOG.gpu("h200")["name"] == CATALOG.gpu("h200-sxm-141gb")["name"]
