"""Accuracy against published training runs, reported as numbers and bounded.

The bounds are the accuracy this model reaches today (see README, "Validation"), a little
loose for float noise; a change that makes any of them worse fails here. The packaged runs file
is a verbatim copy of the published-runs table, so these are also the figures on that file.
"""

from __future__ import annotations

import numpy as np
import pytest

from hetersim import fit


@pytest.fixture(scope="module")
def report(catalog, cal):
    rows = fit.read_runs(fit.default_runs_path())
    return fit.validate(rows, catalog, cal)


def test_every_published_run_is_predicted(report):
    assert report["n_runs"] == 78
    ids = [r["id"] for r in report["rows"]]
    assert len(set(ids)) == 78
    for r in report["rows"]:
        assert r["measured_step_time_s"] > 0 and r["predicted_step_time_s"] > 0


def test_step_time_error_is_bounded(report):
    print(
        f"\nMAPE all {report['mape_step_time_pct']:.1f}%  complete rows {report['mape_step_time_pct_complete']:.1f}%"
        f"  max {report['max_abs_error_pct']:.1f}%  infeasible {report['n_infeasible']}"
    )
    # 7.50% since under SP the backward waits for the output gradient's all-gather (layer._tp_bwd_s:
    # Megatron's _ReduceScatterToSequenceParallelRegion.backward) and torchtitan's async-TP rows run
    # their own stack (half the TP traffic hidden, layer.ASYNC_TP_HIDDEN): Korthikanti's 22B
    # selective row -3.4 -> 0.0%, the NeMo-Launcher 175B -24.0 -> -22.4%, torchtitan's 70B TP row
    # -5.4 -> -1.3%, but Korthikanti's 175B-1T pipeline rows, already slow, +2.5..+8.9 ->
    # +4.8..+10.1% and torchtitan's async-TP rows 1.5-6.5 points faster (-7.0..+1.6%); 7.39% before.
    # 7.39% since PyTorch's ring attention is priced as it runs (elementwise.ring_merge_bytes: its fp32
    # merges and accumulators through HBM; layer._cp_exposed: compiled, each of its collectives waits
    # where it is issued): torchtitan's cp 2-8 rows -8.5 / -32.7 / -36.1 -> -2.5 / -27.1 / -30.2%
    # (8B) and -19.5 / -19.0 / -26.2 -> -3.5 / +3.0 / -6.3% (405B, its ring across nodes).
    # 8.29% since FSDP gathers and reduces one unit at a time (terms/dp.dp_collectives: torchtitan's
    # 8B runs on 128 GPUs lose ring latency the 50M buckets gave them), 8.18% before;
    # 8.18% since Megatron-Core reduces an interleaved chunk's gradients as the chunk finishes
    # (comm.chunked_exposed_s; Nemotron-340B on B200 +17.4 -> -4.8%), 8.32% before;
    # 8.32% since torchtitan's selective recomputation is its op-level policy (every second matmul
    # and the element-wise ops, not attention: terms/compute.op_sac_recompute_s), 8.6% before;
    # 8.5% since DeepSpeed's ZeRO-3 holds a Linear and a reduce bucket, not whole layers
    # (memory.zero3_gathered_bytes): Narayanan's 530B run fits at its own micro-batch 4 (8.9% before).
    # 6.95% since DeepSpeed <= 0.4's ZeRO-3 gathers and reduces one parameter tensor at a time,
    # each through a tensor-list collective that copies per rank (terms/dp.list_copy_s): Narayanan's
    # ZeRO-3 rows no longer slow down as the ranks double (530B on 1120 -> 2240 GPUs +11 / +28%
    # -> -14 / -21%; 175B -3 / -13 / -10% -> -2 / -8 / -0.5%); 7.08% before. The issue's target is 7%.
    # 7.09% since Hopper's FlashAttention-2 figures are read as measured (the forward through SDPA
    # was a non-causal figure taken as causal, the backward an estimate: attention on that kernel 5%
    # faster, catalog attn2_eff_*), torchtitan's 17 rows 0.2-1.2 points further too fast (6.96%
    # before); the same correction brings llm-foundry's independent tables 9.6 -> 9.3%.
    assert report["mape_step_time_pct"] <= 7.1
    # 3.3% since the constants are fitted per source (Narayanan's PTD-P runs, the complete ones,
    # carry 1/9 of the weight instead of 16/78); the target is 10%.
    assert report["mape_step_time_pct_complete"] <= 3.5
    assert report["n_infeasible"] == 0
    # Every row within 31% (the target is 25%). The worst are torchtitan's 8B
    # context-parallel runs at 131k-262k tokens (cp 4-8), predicted 27-30% fast (33-36% before the
    # ring's own costs were priced): per attention FLOP they ran about 1.5x slower than the cp 1-2
    # rows of the same table, which no cost of PyTorch's ring that grows with cp reproduces; then
    # Megatron-LM's 32B weak-scaling row (+25%) and the NeMo-Launcher 175B run (-22%). 31.0% since
    # Hopper's FlashAttention-2 figures are read as measured (30.1% before).
    assert report["max_abs_error_pct"] <= 31.5


@pytest.mark.parametrize(
    "label, bound",
    [
        # 6.5% since under SP the backward waits for the output gradient's all-gather (its
        # selective rows +2.5..+8.9 -> +0.0..+10.1%: the 22B right, the pipelined ones slower);
        # 6.3% since its pipeline sends block (Megatron-LM 2022 waits on each batched send and
        # synchronizes; scatter/gather sends 1/tp: the megatron-legacy profile), 5.4% before; 4.5%
        # when a fitted share of the forward TP collectives was hidden for every stack; the trust
        # issue's target is 4%.
        ("Korthikanti 2022", 6.6),
        ("Narayanan SC'21", 5.0),  # 4.6% (5.2% before legacy ZeRO-3's per-tensor collectives)
        ("NVIDIA/Megatron-LM", 12.5),
        ("NVIDIA/NeMo", 6.5),  # 6.0% (5.1% before the stack profiles and attention by shape)
        # 8.9% since its async-TP rows (Tables 4-6) hide half their TP traffic (8.4% before);
        # 8.4% since PyTorch's ring attention is priced as it runs (12.5% before; 12.0% before
        # FSDP's per-unit collectives, 13.2% before its op-level selective recomputation): the
        # context-parallel rows at 131k-262k tokens (test_step_time_error_is_bounded).
        ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md", 9.0),
    ],
)
def test_per_source_error_is_bounded(report, label, bound):
    src = report["per_source"][label]
    print(f"\n{label}: n={src['n']} MAPE {src['mape_pct']:.1f}% max {src['max_abs_error_pct']:.1f}%")
    assert src["mape_pct"] <= bound


def test_offload_reference_run_within_35_percent(report):
    row = next(r for r in report["rows"] if r["id"].startswith("r141"))
    assert row["feasible"]
    assert abs(row["error_pct"]) <= 35.0


def test_infeasible_row_counts_as_100_percent(catalog, cal, tmp_path):
    src = fit.default_runs_path().read_text().splitlines()
    header, first = src[0], src[1]
    # The 1.7B GPT run with global batch 512 on 32 GPUs, ten times as wide and on one GPU: 153B
    # parameters' states do not fit in 80 GB at any micro-batch validate may substitute. (A row
    # whose tp*pp*dp*cp is not its n_gpus is a mistake in the file, refused: test_bad_input.py.)
    cols = header.split(",")
    vals = first.split(",")
    vals[cols.index("n_gpus")] = "1"
    vals[cols.index("dp")] = "1"
    vals[cols.index("hidden")] = "23040"
    vals[cols.index("ffn_hidden")] = "92160"
    path = tmp_path / "runs.csv"
    path.write_text(header + "\n" + ",".join(vals) + "\n")
    rep = fit.validate(fit.read_runs(path), catalog, cal)
    assert rep["rows"][0]["feasible"] is False
    assert rep["rows"][0]["error_pct"] == 100.0


def test_malformed_runs_files_are_rejected(tmp_path, catalog, cal):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,model\nx,y\n")
    with pytest.raises(ValueError, match="missing columns"):
        fit.read_runs(bad)
    good = fit.default_runs_path()
    text = good.read_text().replace(",8,32,1,1,1,32,", ",8,32,one,1,1,32,", 1)
    broken = tmp_path / "broken.csv"
    broken.write_text(text)
    with pytest.raises(ValueError, match="column tp must be a number"):
        fit.validate(fit.read_runs(broken), catalog, cal)


def _runs_file(tmp_path, ids, **set_cols):
    """A runs CSV with the packaged rows ``ids`` (prefixes), optional columns added or set."""
    import csv
    import io

    src = fit.default_runs_path().read_text().splitlines()
    recs = list(csv.DictReader(src))
    keep = [r for r in recs if any(r["id"].startswith(i) for i in ids)]
    cols = list(recs[0].keys()) + [c for c in set_cols if c not in recs[0]]
    out = io.StringIO()
    w = csv.DictWriter(out, cols)
    w.writeheader()
    for r in keep:
        w.writerow({**r, **set_cols})
    path = tmp_path / f"runs-{len(list(tmp_path.iterdir()))}.csv"
    path.write_text(out.getvalue())
    return path


def test_packaged_runs_are_the_published_schema():
    # Shipped verbatim: no column added, so results on the packaged file and on the original
    # table are the same.
    header = fit.default_runs_path().read_text().splitlines()[0].split(",")
    assert header[: len(fit.REQUIRED_COLUMNS)] == list(fit.REQUIRED_COLUMNS)
    assert "attention" not in header


def test_stacks_are_matched_by_source(report):
    by_id = {r["id"][:4]: r["stack"] for r in report["rows"]}
    assert by_id["r000"] == "megatron-lm-2021"  # Narayanan SC'21
    assert by_id["r022"] == "megatron-lm-2022"  # Korthikanti 2022
    assert by_id["r089"] == "torchtitan-2024-12"  # eager (its label has no "+compile")
    assert by_id["r095"] == "torchtitan-2024-12-compile"
    assert by_id["r043"] == "megatron-core-te"  # Megatron-LM README (2024)
    profiles = {r["id"][:4]: r["stack_profile"] for r in report["rows"]}
    assert profiles["r000"] == "megatron-legacy" and profiles["r089"] == "torchtitan"
    assert profiles["r095"] == "torchtitan-compile" and profiles["r043"] == "megatron"


def test_attention_column_overrides_the_stack(tmp_path, catalog, cal):
    # A Narayanan row (stack: materialized scores) predicted with each kernel explicitly.
    times = {}
    for kind in ("materialized", "flash", "flash2"):
        path = _runs_file(tmp_path, ["r000"], attention=kind)
        times[kind] = fit.validate(fit.read_runs(path), catalog, cal)["rows"][0]["predicted_step_time_s"]
    plain = fit.validate(fit.read_runs(_runs_file(tmp_path, ["r000"])), catalog, cal)
    assert plain["rows"][0]["predicted_step_time_s"] == pytest.approx(times["materialized"])
    # On A100 FlashAttention-2 is the fastest kernel: flash2 == flash; scores cost more.
    assert times["flash2"] == pytest.approx(times["flash"])
    assert times["materialized"] > times["flash"]
    bad = _runs_file(tmp_path, ["r000"], attention="sparse")
    with pytest.raises(ValueError, match="column attention must be one of"):
        fit.validate(fit.read_runs(bad), catalog, cal)


def test_flash2_is_slower_on_hopper(tmp_path, catalog, cal):
    # torchtitan's SDPA ran FlashAttention-2 on H100 (about half FlashAttention-3's rate).
    t = {}
    for kind in ("flash", "flash2"):
        path = _runs_file(tmp_path, ["r092"], attention=kind)
        t[kind] = fit.validate(fit.read_runs(path), catalog, cal)["rows"][0]["predicted_step_time_s"]
    assert t["flash2"] > 1.1 * t["flash"]


def test_fsdp_stack_shards_over_context_parallel_ranks(tmp_path, catalog, cal):
    # torchtitan's dp=1, cp=8 rows are written zero=0 but FSDP shards over the dp x cp mesh.
    path = _runs_file(tmp_path, ["r095", "r106"])
    rep = fit.validate(fit.read_runs(path), catalog, cal)
    assert all(r["feasible"] for r in rep["rows"])
    # The same rows matched to no stack run unsharded and do not fit.
    rep0 = fit.validate(fit.read_runs(path, stacks=[]), catalog, cal)
    assert not any(r["feasible"] for r in rep0["rows"])


def test_a_rows_stack_column_names_its_profile_or_an_entry(tmp_path, catalog, cal):
    # r043 (Megatron-LM README, matched to megatron-core-te) and r000 (Narayanan SC'21, matched to
    # megatron-lm-2021: materialised attention) without the column, then naming a stack.
    def rows(ids=("r000", "r043"), **cols):
        rep = fit.validate(fit.read_runs(_runs_file(tmp_path, list(ids), **cols)), catalog, cal)
        return {r["id"][:4]: r for r in rep["rows"]}

    plain = rows()
    assert plain["r000"]["stack"] == "megatron-lm-2021" and plain["r043"]["stack"] == "megatron-core-te"
    # A profile: rows whose matched entry runs another profile lose that entry's facts.
    fsdp = rows(stack="FSDP2")  # a synonym, read case-insensitively
    assert {r["stack_profile"] for r in fsdp.values()} == {"fsdp"}
    assert fsdp["r043"]["predicted_step_time_s"] > plain["r043"]["predicted_step_time_s"]  # eager, FlashAttention-2
    # ... and keep it where it runs the named profile (r000's materialised scores stay).
    legacy = rows(["r000"], stack="megatron-legacy")["r000"]
    assert legacy["stack"] == "megatron-lm-2021"
    assert legacy["predicted_step_time_s"] == pytest.approx(plain["r000"]["predicted_step_time_s"])
    # r043 ran FP8, which Megatron-LM of 2020-22 did not have (the profile's fp8 fact): refused.
    with pytest.raises(ValueError, match=r"row r043\S*: the stack megatron-legacy trains in no 8-bit precision"):
        rows(["r043"], stack="megatron-legacy")
    assert rows(["r043"], stack="megatron-legacy", precision="bf16")["r043"]["stack"] == "megatron-legacy"
    # An entry of the stacks file brings its facts (torchtitan: SDPA's FlashAttention-2).
    titan = rows(stack="torchtitan-2024-12")
    assert {r["stack"] for r in titan.values()} == {"torchtitan-2024-12"}
    assert {r["stack_profile"] for r in titan.values()} == {"torchtitan"}
    # Empty: the source decides, as without the column.
    assert rows(stack="")["r000"]["predicted_step_time_s"] == pytest.approx(plain["r000"]["predicted_step_time_s"])
    with pytest.raises(ValueError, match=r"row r000\S*: column stack must be a profile \(megatron, .*got 'colossal'"):
        fit.read_runs(_runs_file(tmp_path, ["r000"], stack="colossal"))


def test_a_rows_shard_group_column_prices_hybrid_sharding(tmp_path, catalog, cal):
    # torchtitan's 128-GPU FSDP row (r096) as if hybrid-sharded inside each 8-GPU node.
    def row(**cols):
        return fit.validate(fit.read_runs(_runs_file(tmp_path, ["r096"], **cols)), catalog, cal)["rows"][0]

    full, empty, node = row(), row(shard_group=""), row(shard_group="8")
    assert empty["predicted_step_time_s"] == pytest.approx(full["predicted_step_time_s"])
    assert node["hbm_used_GiB"] > full["hbm_used_GiB"]
    assert node["predicted_step_time_s"] != pytest.approx(full["predicted_step_time_s"])
    assert not row(shard_group="3")["feasible"]  # 3 does not divide the 128 data-parallel ranks
    with pytest.raises(ValueError, match="column shard_group must be a number"):
        row(shard_group="x")


def test_bad_stacks_file_is_rejected(tmp_path):
    from hetersim.fit.stacks import load_stacks

    f = tmp_path / "stacks.toml"
    f.write_text('[x]\nmatch = ["a"]\nattention = "sparse"\n')
    with pytest.raises(ValueError, match="stack x: attention must be one of"):
        load_stacks(f)
    f.write_text("[x]\nmatch = []\n")
    with pytest.raises(ValueError, match="match must be a non-empty list"):
        load_stacks(f)
    f.write_text('[x]\nmatch = ["a"]\ncolour = 1\n')
    with pytest.raises(ValueError, match="unknown key 'colour'"):
        load_stacks(f)


def test_memory_against_published_figures(catalog, cal):
    rep = fit.validate_memory(None, catalog, cal)
    print(f"\nmemory: n={rep['n']} MAPE {rep['mape_pct']:.1f}%")
    korth = [r for r in rep["rows"] if r["component"] == "activations"]
    assert len(korth) == 8
    # Korthikanti et al.'s activation memory (Fig. 1, first pipeline stage, interleaved schedule)
    for r in korth:
        assert r["predicted_GiB"] == pytest.approx(r["measured_GiB"], rel=0.01)
    states = [r for r in rep["rows"] if r["component"].startswith("params+grads+optimizer")]
    assert states and all(abs(r["error_pct"]) <= 10.0 for r in states)
    assert rep["mape_pct"] <= 13.0


@pytest.mark.slow
def test_leave_one_source_out_error_is_bounded(catalog, held_out):
    """Fit without each source in turn and predict it: how the model does on unseen runs."""
    from hetersim.fit.calibration import cross_validate

    cv = cross_validate(catalog=catalog, steps=300, held=held_out)
    print(f"\nleave-one-source-out MAPE {cv['mape_step_time_pct']:.1f}%")
    # 8.89% since SP's backward all-gather and torchtitan's async TP are priced (NeMo 24.07 held out
    # 9.6 -> 10.6%, torchtitan 8.7 -> 9.4%, Megatron-LM 11.2 -> 10.8%); still the trust issue's 9%.
    # 8.59% since PyTorch's ring attention is priced as it runs (torchtitan held out 8.7%; below the
    # trust issue's 9% target for the first time). 9.57% since FSDP's per-unit collectives
    # (torchtitan's held-out rows 12.3 -> 12.8%);
    # 9.45% since interleaved chunks reduce their gradients early (comm.chunked_exposed_s): nine
    # of the ten held-out sources move by -2.2 .. +0.6 points, but without Megatron-LM's weak-scaling
    # rows the fit falls into another optimum (tp_overlap 0.27, kernel overhead 5 us, against 0.86 and
    # 6.3 before), and that source goes 7.7 -> 11.1%. 9.08% before (9.35% before torchtitan's
    # op-level selective recomputation; 9.44% with whole ZeRO-3 layers in HBM); the trust issue's
    # target is 9%.
    assert cv["mape_step_time_pct"] <= 9.0
    assert cv["per_source"]["Korthikanti 2022"]["mape_pct"] <= 8.0


def test_source_weights_give_every_source_the_same_total_weight():
    from hetersim.fit.calibration import source_weights

    labels = np.array(["a", "a", "a", "b", "c", "c"])
    mask = np.array([1, 1, 0, 1, 1, 1], bool)  # one row of "a" left out (infeasible / held out)
    w = source_weights(labels, mask)
    assert w[2] == 0.0
    for label in "abc":
        assert w[labels == label].sum() == pytest.approx(1.0)
    assert w[0] == w[1] == pytest.approx(0.5)
    # A source with every row masked out gets no weight (and no division by zero).
    assert source_weights(labels, labels != "b")[3] == 0.0


def test_whole_local_batch_is_split_when_it_does_not_fit(tmp_path, catalog, cal):
    # Narayanan's 530B ZeRO-3 run on 640 GPUs gives only the global batch (2560, 4 per GPU), and
    # four sequences at once fit in 80 GB; twice the batch, 8 per GPU as one micro-batch, do not,
    # so validate runs gradient accumulation over smaller micro-batches and reports it.
    path = _runs_file(tmp_path, ["r013"], global_batch="5120", micro_batch="8")
    row = fit.validate(fit.read_runs(path), catalog, cal)["rows"][0]
    assert row["feasible"]
    assert "micro_batch=4" in row["substituted"] or "micro_batch=2" in row["substituted"]
    assert (
        "micro_batch"
        not in fit.validate(fit.read_runs(_runs_file(tmp_path, ["r013"])), catalog, cal)["rows"][0]["substituted"]
    )
    # A row whose micro-batch is not the whole local batch is never split.
    fixed = _runs_file(tmp_path, ["r013"], global_batch="10240", micro_batch="8")
    row2 = fit.validate(fit.read_runs(fixed), catalog, cal)["rows"][0]
    assert "micro_batch" not in row2["substituted"]


def test_every_packaged_stack_fact_cites_a_source():
    from hetersim.fit.stacks import load_stacks

    stacks = load_stacks()
    assert stacks
    for st in stacks:
        # Every entry names its profile (catalog/stacks.toml) and says why; other facts as given.
        facts = ["stack"] if st.stack != "megatron" or "stack" in st.sources else []
        facts += ["attention"] if st.attention else []
        facts += ["shards_over_cp"] if st.shards_over_cp else []
        assert facts, st.key
        for fact in facts:
            assert len(st.sources.get(fact, "")) > 40, (st.key, fact)


@pytest.mark.parametrize("tier, device", [("cxl-expander", "micron-cz120:1"), ("cxl-pool", "samsung-cmm-b-pool:1host")])
def test_offload_to_a_cxl_tier_assumes_a_device(tmp_path, catalog, cal, tier, device):
    # The ZeRO-Offload row with its optimizer states and gradients on a CXL tier instead of host
    # DRAM: the V100 entry configures no CXL device, so validate assumes one and says so.
    host = fit.validate(fit.read_runs(_runs_file(tmp_path, ["r141"])), catalog, cal)["rows"][0]
    path = _runs_file(tmp_path, ["r141"], offload_tier=tier)
    row = fit.validate(fit.read_runs(path), catalog, cal)["rows"][0]
    assert row["feasible"]
    assert device in row["substituted"]
    assert "cxl" not in host["substituted"]
    # CPU-Adam on CXL-resident states is slower than on local DRAM.
    assert row["predicted_step_time_s"] > host["predicted_step_time_s"]


def test_runs_file_from_a_spreadsheet_is_read(tmp_path, catalog, cal):
    # A byte-order mark, CRLF line ends, a note spanning two lines inside quotes, padded headers.
    import csv
    import io

    src = fit.default_runs_path().read_text().splitlines()
    recs = [r for r in csv.DictReader(src) if r["id"].startswith(("r000", "r022"))]
    recs[0]["notes"] = "first line\nsecond line, with a comma"
    out = io.StringIO()
    w = csv.DictWriter(out, list(recs[0].keys()), lineterminator="\r\n")
    w.writerow({k: f" {k} " for k in recs[0]})
    w.writerows(recs)
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbf" + out.getvalue().encode())
    plain = fit.validate(fit.read_runs(_runs_file(tmp_path, ["r000", "r022"])), catalog, cal)
    rep = fit.validate(fit.read_runs(path), catalog, cal)
    assert [r["id"] for r in rep["rows"]] == [r["id"] for r in plain["rows"]]
    assert rep["mape_step_time_pct"] == pytest.approx(plain["mape_step_time_pct"])


def test_other_spellings_and_blank_defaults_read_as_the_schema(tmp_path, catalog, cal):
    # r043: GPT-3 5B on 64 H100, tp1 pp1 vp1 cp1 dp64, fp8, plain MLP, no recompute.
    base = fit.validate(fit.read_runs(_runs_file(tmp_path, ["r043"])), catalog, cal)["rows"][0]
    alt = _runs_file(
        tmp_path, ["r043"], mlp="GeLU", precision="FP8", recompute="no", vp="", cp="", dp="", scaleup_domain=""
    )
    row = fit.validate(fit.read_runs(alt), catalog, cal)["rows"][0]
    assert row["predicted_step_time_s"] == pytest.approx(base["predicted_step_time_s"], rel=1e-6)
    bad = _runs_file(tmp_path, ["r043"], precision="int4")
    with pytest.raises(ValueError, match="r043"):
        fit.validate(fit.read_runs(bad), catalog, cal)


def test_a_run_that_cannot_hold_its_logits_ran_a_chunked_loss(tmp_path, catalog, cal):
    """Llama 3.1 8B fine-tuned at 128k tokens on one A100 40GB, every state offloaded: its
    [tokens x vocab] logits alone exceed the card (131,072 x 128,256 x 6 bytes), so a row that
    states no loss kernel is priced with the fused chunked one (and says so); a row that states
    ``loss = materialized`` does not fit, one that states ``chunked`` is priced the same."""
    one = dict(gpu="a100-sxm-40gb", n_gpus="1", tp="1", pp="1", vp="1", dp="1", cp="1", sp="0", zero="0",
               offload="optimizer+grads+params+activations", offload_tier="host-dram", recompute="full",
               micro_batch="1", global_batch="1", seq_len="131072", precision="bf16", scaleup_domain="8",
               source="a single-GPU long-context fine-tuning table", notes="", assumed="")  # fmt: skip
    plain = fit.validate(fit.read_runs(_runs_file(tmp_path, ["r089"], **one)), catalog, cal)["rows"][0]
    assert plain["feasible"] and "loss=chunked" in plain["substituted"]
    held = fit.validate(fit.read_runs(_runs_file(tmp_path, ["r089"], **one, loss="materialized")), catalog, cal)
    assert not held["rows"][0]["feasible"]
    fused = fit.validate(fit.read_runs(_runs_file(tmp_path, ["r089"], **one, loss="chunked")), catalog, cal)
    row = fused["rows"][0]
    assert row["feasible"] and "loss" not in row["substituted"]
    assert row["predicted_step_time_s"] == pytest.approx(plain["predicted_step_time_s"])
    with pytest.raises(ValueError, match="column loss must be one of"):
        fit.validate(fit.read_runs(_runs_file(tmp_path, ["r089"], **one, loss="sampled")), catalog, cal)
