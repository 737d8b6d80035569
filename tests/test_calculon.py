"""Calculon's system files (``systems/*.json``) through ``hetersim evaluate --system``: the
mapping onto a catalog device, the same answer as that device written by hand, and refusals."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from hetersim.catalog import load_catalog
from hetersim.catalog.calculon import calculon_device, with_calculon_system
from tests.test_cli import assert_user_error, run, run_json

# calculon-ai/calculon systems/a100_80g.json at caa4b11f, unchanged (tests/data/calculon/README.md).
A100_80G = Path(__file__).parent / "data" / "calculon" / "a100_80g.json"
EVALUATE = "evaluate --model gpt3-175b --gpus 64 --tp 8 --pp 8 --global-batch 64 --seq-len 2048".split()
# 64-way data parallel over 8 nodes: the gradient all-reduce crosses the scale-out network.
DATA_PARALLEL = "evaluate --model llama2-7b --gpus 64 --tp 1 --global-batch 64 --zero 1 --seq-len 4096".split()


def test_a100_system_file_maps_onto_a_device():
    """Every number the file gives lands in the field that means it (values read off the file by
    hand); what Calculon does not describe stays the base entry's."""
    base = load_catalog().gpu("a100-sxm-80gb")
    entry, links = calculon_device(A100_80G, base)
    assert (entry["peak_tflops_bf16"], entry["peak_tflops_fp16"], entry["peak_tflops_fp8"]) == (312, 312, 0)
    assert entry["gemm_eff_bf16"] == 0.95  # matrix.float16.gflops_efficiency[0]: ops >= 128 GFLOP
    assert (entry["hbm_capacity_GiB"], entry["hbm_bw_GBps"]) == (80, 2048)
    # mem2 is per processor in Calculon, per node here: 8 GPUs x 512 GiB, 8 x 32 GB/s.
    assert (entry["host_dram_GiB"], entry["host_path_GBps"]) == (4096, 256)
    assert entry["scaleup_domain"] == 8 and entry["nics_per_gpu"] == 1.0
    up, out = links[entry["scaleup_link"]], links[entry["nic"]]
    fields = ("kind", "bw_GBps", "busbw_eff", "latency_us")
    assert [up[f] for f in fields] == ["scaleup", 300, 0.65, pytest.approx(10)]  # latency 1e-5 s
    assert [out[f] for f in fields] == ["scaleout", 25, 0.9, pytest.approx(20)]
    for field in ("tdp_W", "price_usd_per_hour", "sm_count", "host_link", "gpus_per_node", "attn_eff_fwd"):
        assert entry[field] == base[field]
    assert entry["sources"]["hbm_bw_GBps"] == f"Calculon system file {A100_80G}: mem1.GBps"
    assert "aliases" not in entry and "measured_gemm_tflops_bf16" not in entry


def _hand_written(tmp_path: Path) -> Path:
    """The device of the system file written as a catalog file by hand: the A100 entry with the
    file's numbers, and two links with its networks' (latencies per step, in us)."""
    base = load_catalog().gpu("a100-sxm-80gb")
    gpu = {k: v for k, v in base.items() if k not in ("sources", "aliases")}
    gpu.update(
        name="hand-written", peak_tflops_fp32=0.0, gemm_eff_bf16=0.95, gemm_eff_fp8=0.0, hbm_bw_GBps=2048.0,
        host_dram_GiB=4096.0, host_path_GBps=256.0, scaleup_link="hand-up", nic="hand-out", scaleup_domain=8,
    )  # fmt: skip
    lines = ["[gpus.hand]"] + [f"{k} = {json.dumps(v)}" for k, v in gpu.items()]
    lines += ["[links.hand-up]", 'name = "up"', 'kind = "scaleup"', "bw_GBps = 300.0", "latency_us = 10.0"]
    lines += ["busbw_eff = 0.65", "[links.hand-out]", 'name = "out"', 'kind = "scaleout"', "bw_GBps = 25.0"]
    lines += ["latency_us = 20.0", "busbw_eff = 0.9"]
    path = tmp_path / "hand.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_system_file_evaluates_as_the_same_device_written_by_hand(tmp_path):
    calculon = run_json([*EVALUATE, "--gpu", "a100", "--system", A100_80G])
    hand = run_json([*EVALUATE, "--gpu", "hand", "--catalog", _hand_written(tmp_path)])
    native = run_json([*EVALUATE, "--gpu", "a100"])
    assert calculon["step_time_s"] == pytest.approx(hand["step_time_s"], rel=1e-6)
    assert calculon["breakdown_s"] == pytest.approx(hand["breakdown_s"], rel=1e-6)
    assert calculon["memory_per_gpu_GiB"] == pytest.approx(hand["memory_per_gpu_GiB"], rel=1e-6)
    assert calculon["step_time_s"] != pytest.approx(native["step_time_s"], rel=1e-3)  # the file changed something
    assert calculon["gpu"] == "calculon-a100_80g"


def test_more_scale_out_bandwidth_in_the_file_is_never_slower(tmp_path):
    data = json.loads(A100_80G.read_text())
    times = []
    for bandwidth in (0.5, 2, 8, 25, 100):
        data["networks"][1]["bandwidth"] = bandwidth
        path = tmp_path / f"bw{bandwidth}.json"
        path.write_text(json.dumps(data))
        times.append(run_json([*DATA_PARALLEL, "--gpu", "a100", "--system", path])["step_time_s"])
    assert times == sorted(times, reverse=True) and times[0] > times[-1]


def test_the_note_names_the_keys_the_model_does_not_use():
    result = run([*EVALUATE, "--gpu", "a100", "--system", A100_80G])
    assert result.exit_code == 0, result.stderr
    assert "networks[*].ops" in result.stderr and "processing_mode" in result.stderr
    quiet = run(["-q", *EVALUATE, "--gpu", "a100", "--system", A100_80G])
    assert quiet.exit_code == 0 and quiet.stderr == ""


def _edit(data: dict, path: str, value) -> dict:
    """``data`` with the key at ``path`` (dot-separated, list indices as numbers) set to
    ``value``, or removed where ``value`` is the ``...`` sentinel."""
    out = copy.deepcopy(data)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = out
    for p in parents:
        node = node[p]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return out


BAD = [
    ("mem3", {"GiB": 1}, ["mem3", "not a Calculon system key"]),
    ("mem2", ..., ["mem2 is missing"]),
    ("matrix.float16.tflops", -312, ["matrix.float16.tflops", "must be a number > 0"]),
    ("matrix.float16.gflops_efficiency.0.1", 1.2, ["matrix.float16.gflops_efficiency[0][1]", "<= 1"]),
    ("matrix.int4", {"tflops": 1, "gflops_efficiency": [[0, 1.0]]}, ["matrix.int4", "known: float16"]),
    ("mem1.GBps", "fast", ["mem1.GBps", "got 'fast'"]),
    ("networks.1.bandwith", 25, ["networks[1].bandwith"]),
    ("networks.0.latency", 0, ["networks[0].latency", "> 0"]),
    ("processing_mode", "overlap", ["processing_mode", "'roofline' or 'no_overlap'"]),
    ("networks", [], ["networks must list two networks", "got 0"]),
]


@pytest.mark.parametrize(("key", "value", "fragments"), BAD, ids=[b[0] for b in BAD])
def test_a_system_file_hetersim_cannot_map_is_refused_in_one_line(tmp_path, key, value, fragments):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_edit(json.loads(A100_80G.read_text()), key, value)))
    assert_user_error(run([*EVALUATE, "--gpu", "a100", "--system", path]), "bad.json", *fragments)


def test_three_networks_only_float8_and_a_cluster_are_refused(tmp_path):
    data = json.loads(A100_80G.read_text())
    three = tmp_path / "three.json"
    three.write_text(json.dumps({**data, "networks": data["networks"] + data["networks"][1:]}))
    assert_user_error(run([*EVALUATE, "--gpu", "a100", "--system", three]), "networks must list two", "got 3")
    fp8 = tmp_path / "fp8.json"
    fp8.write_text(json.dumps({**data, "matrix": {"float8": data["matrix"]["float16"]}}))
    assert_user_error(run([*EVALUATE, "--gpu", "a100", "--system", fp8]), "matrix needs float16 or bfloat16")
    cluster = [*EVALUATE, "--cluster", "a100:32,h100-sxm-80gb:32", "--system", A100_80G]
    assert_user_error(run(cluster), "--system", "--gpu")
    assert_user_error(run([*EVALUATE, "--gpu", "a100", "--system", tmp_path / "none.json"]), "none.json", "not found")
    text = tmp_path / "text.json"
    text.write_text("{not json")
    assert_user_error(run([*EVALUATE, "--gpu", "a100", "--system", text]), "text.json", "invalid JSON")


def test_the_api_adds_the_device_to_a_catalog():
    catalog, key = with_calculon_system(load_catalog(), "a100", A100_80G)
    assert key == "calculon-a100_80g" and catalog.gpu(key)["hbm_bw_GBps"] == 2048
    assert catalog.gpu("a100")["hbm_bw_GBps"] == 2039  # the base entry is unchanged
