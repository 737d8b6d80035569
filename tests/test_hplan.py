"""Heterogeneous plans (hetersim.hplan, hetersim.hsim): the file format, its checks, and the
physics of stages whose replicas sit on different device kinds."""

from __future__ import annotations

from pathlib import Path

import jax
import pytest

from hetersim import build, hplan, hsim
from hetersim.simulate import STEP_TERMS, simulate
from hetersim.types import Infeasible

from .test_cli import assert_user_error, run

SHAPE = (2, 4, 2)  # every plan of this file padded alike: one compilation
H100, A100 = "h100-sxm-80gb", "a100-sxm-80gb"
KINDS = (A100, H100)  # every plan's device table holds these two (unused ones are masked out)


def _sim_plan():
    """The front door's compiled plan engine (one program per shape for the whole file, the CLI
    tests' included)."""
    from hetersim import api

    return api._compiled("plan")


def _evaluate(catalog, cal, hp, model="llama2-7b", cluster=None, seq_len=4096):
    m = build.model_spec(catalog.model(model))
    kinds = [*KINDS, *(k for k in hp.kinds() if k not in KINDS)]  # the same kinds, so one compilation
    hs = hsim.hetero_spec(hp, catalog, cluster or {k: 1 << 20 for k in hp.kinds()}, shape=SHAPE, kinds=kinds)
    return _sim_plan()(m, hs, hsim.common_plan(hp, seq_len), cal)


def _one_pipeline(stages, balance="equal", **options):
    opts = dict(global_batch=64, micro_batch=1)
    opts.update(options)
    st = tuple(hplan.Stage(layers, tuple(hplan.Replica(*r) for r in reps)) for layers, reps in stages)
    return hplan.HeteroPlan((hplan.Pipeline(st),), balance, opts)


def _homogeneous(catalog, cal, tp, pp, dp, model="llama2-7b", **options):
    m = build.model_spec(catalog.model(model))
    sys = build.system_spec(catalog.gpu(H100), catalog.links, memory=catalog.memory)
    opts = dict(global_batch=64, micro_batch=1, seq_len=4096)
    opts.update(options)
    return jax.jit(simulate)(m, sys, build.plan_spec(n_gpus=tp * pp * dp, tp=tp, pp=pp, **opts), cal)


def _same_times(a, b):
    for k in ("step_time_s", "tokens_per_s", "mfu", *STEP_TERMS):
        assert float(getattr(a, k)) == pytest.approx(float(getattr(b, k)), rel=1e-5, abs=1e-7), k


@pytest.mark.parametrize(
    "stages, tp, pp, dp",
    [
        ([(32, [(H100, 8, 4)])], 8, 1, 4),
        ([(8, [(H100, 2, 4)])] * 4, 2, 4, 4),
        # uneven: the homogeneous model puts the remainder with the head on the busiest stage
        ([(10, [(H100, 4, 2)]), (11, [(H100, 4, 2)]), (11, [(H100, 4, 2)])], 4, 3, 2),
        # one stage's replicas written as two groups of one kind
        ([(16, [(H100, 4, 1), (H100, 4, 1)]), (16, [(H100, 4, 2)])], 4, 2, 2),
    ],
)
def test_a_plan_of_one_kind_equals_the_homogeneous_model(catalog, cal, stages, tp, pp, dp):
    """Every time term, the throughput and the MFU equal :func:`simulate`'s exactly; memory is per
    stage, never above the homogeneous model's busiest-stage bound, equal when one stage holds
    everything."""
    het = _evaluate(catalog, cal, _one_pipeline(stages)).total
    homo = _homogeneous(catalog, cal, tp, pp, dp)
    assert int(het.infeasible) == 0 and int(homo.infeasible) == 0
    _same_times(het, homo)
    assert float(het.hbm_used_GiB) <= float(homo.hbm_used_GiB) * (1 + 1e-6)
    if pp == 1:
        assert float(het.hbm_used_GiB) == pytest.approx(float(homo.hbm_used_GiB), rel=1e-6)


def test_fewer_layers_beside_the_head_is_faster(catalog, cal):
    def step(split):
        return float(_evaluate(catalog, cal, _one_pipeline([(n, [(H100, 4, 2)]) for n in split])).total.step_time_s)

    assert step((11, 11, 10)) < step((10, 11, 11))


def test_copies_of_a_pipeline_equal_replicas_of_its_stages(catalog, cal):
    st = tuple(hplan.Stage(16, (hplan.Replica(H100, 2, 1),)) for _ in range(2))
    copies = hplan.HeteroPlan((hplan.Pipeline(st, count=4),), "equal", dict(global_batch=64, micro_batch=1))
    replicas = _one_pipeline([(16, [(H100, 2, 4)])] * 2)
    _same_times(_evaluate(catalog, cal, copies).total, _evaluate(catalog, cal, replicas).total)


def test_moving_a_replica_from_the_slow_to_the_fast_kind_never_slows_a_speed_balanced_step(catalog, cal):
    steps = []
    for n_fast in range(0, 5):
        reps = [r for r in ((A100, 4, 4 - n_fast), (H100, 4, n_fast)) if r[2] > 0]
        steps.append(float(_evaluate(catalog, cal, _one_pipeline([(32, reps)], "speed")).total.step_time_s))
    assert all(b <= a * (1 + 1e-6) for a, b in zip(steps, steps[1:], strict=False)), steps
    assert steps[-1] < steps[0]


def test_speed_balance_gives_the_fast_kind_more_micro_batches(catalog, cal):
    hp = _one_pipeline([(32, [(A100, 4, 1), (H100, 4, 1)])], "speed")
    out = _evaluate(catalog, cal, hp)
    slow, fast = (float(out.slot_microbatches[0, 0, r]) for r in (0, 1))
    assert slow + fast == 64 and fast > slow
    equal = _evaluate(catalog, cal, _one_pipeline([(32, [(A100, 4, 1), (H100, 4, 1)])], "equal"))
    assert float(out.total.step_time_s) < float(equal.total.step_time_s)


def test_cross_kind_traffic_is_never_cheaper_than_the_slowest_link_it_crosses(catalog, cal):
    """A data-parallel group spanning A100 and H100 replicas synchronises over the scale-out
    network, at least as slowly as the same group of either kind forced onto its NICs, and a
    slower link named between the kinds only slows it."""
    mixed = _evaluate(catalog, cal, _one_pipeline([(32, [(A100, 4, 1), (H100, 4, 1)])])).total
    own_nics = []
    for kind in (A100, H100):
        hp = _one_pipeline([(32, [(kind, 4, 2)])])
        own_nics.append(float(_evaluate(catalog, cal, hp, cluster={kind: 4}).total.dp_comm_s))  # 4-GPU islands
        one_node = float(_evaluate(catalog, cal, hp, cluster={kind: 8}).total.dp_comm_s)
        assert float(mixed.dp_comm_s) > one_node
    assert float(mixed.dp_comm_s) >= max(own_nics) * (1 - 1e-6)
    slow = catalog.links
    eth = min((k for k, e in slow.items() if e["kind"] == "scaleout"), key=lambda k: slow[k]["bw_GBps"])
    hp = _one_pipeline([(32, [(A100, 4, 1), (H100, 4, 1)])])
    import dataclasses

    linked = _evaluate(catalog, cal, dataclasses.replace(hp, link=eth)).total
    assert float(linked.dp_comm_s) >= float(mixed.dp_comm_s)


def test_cross_network_applies_each_links_bus_efficiency_once(catalog):
    """The network between kinds carries the slowest bus bandwidth (line rate x bus efficiency) of
    the links it may cross: a named link slower than the kinds' NICs sets it at exactly its own
    bus bandwidth, a faster one leaves the kinds' slowest NIC in charge."""
    import dataclasses

    hp = _one_pipeline([(32, [(A100, 4, 1), (H100, 4, 1)])])
    nics = []
    for kind in (A100, H100):
        gpu = catalog.gpu(kind)
        nic = catalog.links[gpu["nic"]]
        nics.append(float(nic["bw_GBps"]) * float(gpu.get("nics_per_gpu", 1.0)) * float(nic["busbw_eff"]))

    def bus(link=""):
        net = hsim.hetero_spec(dataclasses.replace(hp, link=link), catalog, shape=SHAPE).cross
        return float(net.bw_GBps[-1]) * float(net.busbw_eff[-1])

    assert bus() == pytest.approx(min(nics), rel=1e-6)
    scaleout = {k: e for k, e in catalog.links.items() if e["kind"] == "scaleout"}
    for name, e in scaleout.items():
        own = float(e["bw_GBps"]) * float(e.get("busbw_eff", 1.0))
        assert bus(name) == pytest.approx(min(own, min(nics)), rel=1e-6), name


def test_a_data_parallel_group_across_kinds_keeps_each_kinds_nodes(catalog, cal):
    """Gradient synchronisation over 8 A100 + 8 H100 replicas runs as NCCL's ring does: each
    kind's hops inside its own node, the nodes joined by the slower NIC. With the A100's NVLink
    and NIC the slower at both levels, it costs what 16 A100 in two nodes cost, and less than
    the same group with every GPU its own node (nothing hidden behind the backward, to compare
    the collectives themselves)."""
    import dataclasses

    cal = dataclasses.replace(cal, dp_overlap=0.0)
    mixed = _one_pipeline([(32, [(A100, 1, 8), (H100, 1, 8)])])
    t = float(_evaluate(catalog, cal, mixed, cluster={A100: 8, H100: 8}).total.dp_comm_s)
    a100 = float(_evaluate(catalog, cal, _one_pipeline([(32, [(A100, 1, 16)])]), cluster={A100: 16}).total.dp_comm_s)
    flat = float(_evaluate(catalog, cal, mixed, cluster={A100: 1, H100: 1}).total.dp_comm_s)
    assert t == pytest.approx(a100, rel=1e-5)
    assert t < 0.5 * flat


def test_pipeline_sends_between_kinds_cross_the_scale_out_network(catalog, cal):
    same = _evaluate(catalog, cal, _one_pipeline([(16, [(H100, 2, 1)]), (16, [(H100, 2, 1)])]), cluster={H100: 4})
    mixed = _evaluate(catalog, cal, _one_pipeline([(16, [(H100, 2, 1)]), (16, [(A100, 2, 1)])]))
    assert float(mixed.total.pp_comm_s) > float(same.total.pp_comm_s) > 0


def test_an_embedding_only_first_stage_holds_no_layer_and_less_memory(catalog, cal):
    hp = _one_pipeline([(0, [(H100, 1, 1)]), (16, [(H100, 1, 1)]), (16, [(H100, 1, 1)])], global_batch=16)
    out = _evaluate(catalog, cal, hp)
    assert int(out.total.infeasible) == 0
    assert [int(out.stage_layers[0, s]) for s in range(3)] == [0, 16, 16]
    hbm = [float(out.slot_hbm_used_GiB[0, s, 0]) for s in range(3)]
    assert hbm[0] < hbm[1] and hbm[0] < hbm[2]


def test_balanced_layers_follow_the_speed_of_each_stage(catalog, cal):
    hp = _one_pipeline([(None, [(A100, 2, 1)]), (None, [(H100, 2, 1)])])
    out = _evaluate(catalog, cal, hp)
    slow, fast = int(out.stage_layers[0, 0]), int(out.stage_layers[0, 1])
    assert slow + fast == 32 and fast > slow


def test_pipelines_with_their_own_layer_splits(catalog, cal):
    """FlashFlex-style: two pipelines on different kinds, each with its own stages and split."""
    a = hplan.Pipeline((hplan.Stage(32, (hplan.Replica(H100, 4, 1),)),))
    b = hplan.Pipeline(tuple(hplan.Stage(n, (hplan.Replica(A100, 2, 1),)) for n in (12, 20)))
    hp = hplan.HeteroPlan((a, b), "speed", dict(global_batch=64, micro_batch=1))
    out = _evaluate(catalog, cal, hp)
    assert int(out.total.infeasible) == 0
    assert float(out.slot_microbatches[0, 0, 0]) > float(out.slot_microbatches[1, 0, 0])
    assert float(out.slot_microbatches[0, 0, 0]) + float(out.slot_microbatches[1, 0, 0]) == 64


def test_layers_that_do_not_cover_the_model_are_flagged_in_the_traced_model(catalog, cal):
    hp = _one_pipeline([(10, [(H100, 1, 1)]), (10, [(H100, 1, 1)])])
    assert int(_evaluate(catalog, cal, hp).total.infeasible) & int(Infeasible.LAYERS_DIVIDE)


def test_a_middle_stage_without_layers_is_flagged_and_an_end_stage_without_layers_is_not(catalog, cal):
    """AMP's search places a boundary after its no-op entry (DachengLi1/AMP het_cluster_results.txt:
    stage [1, 2) of a pp 16 plan), a stage with no parameters: the trial failed. Only the first
    (embedding) or last (head) stage may hold no layers."""
    middle = _one_pipeline([(16, [(H100, 1, 1)]), (0, [(H100, 1, 1)]), (16, [(H100, 1, 1)])])
    assert int(_evaluate(catalog, cal, middle).total.infeasible) & int(Infeasible.LAYERS_DIVIDE)
    ends = _one_pipeline([(0, [(H100, 1, 1)]), (16, [(H100, 1, 1)]), (16, [(H100, 1, 1)]), (0, [(H100, 1, 1)])])
    assert int(_evaluate(catalog, cal, ends).total.infeasible) == 0


# --------------------------------------------------------------------------------------------
# The file format and its errors
# --------------------------------------------------------------------------------------------

PLAN = """\
global_batch = 64
micro_batch = 1
balance = "speed"
[[stage]]
layers = 12
replicas = [{ gpu = "a100-sxm-80gb", tp = 4 }, { gpu = "h100-sxm-80gb", tp = 2, count = 2 }]
[[stage]]
layers = 20
gpu = "h100-sxm-80gb"
tp = 4
dp = 2
"""


def test_a_plan_file_round_trips_and_evaluates(tmp_path, catalog, cal):
    path = tmp_path / "plan.toml"
    path.write_text(PLAN)
    hp = hplan.read_plan_file(path)
    assert hp.gpus() == {A100: 4, H100: 12}
    again = hplan.parse_plan(hp.as_dict())
    assert again.pipelines == hp.pipelines and again.balance == hp.balance
    hplan.check(hp, catalog.model("llama2-7b"), {A100: 4, H100: 12})
    out = _evaluate(catalog, cal, hp)
    assert int(out.total.infeasible) == 0 and float(out.total.step_time_s) > 0


@pytest.mark.parametrize(
    "edit, message",
    [
        (("layers = 20", "layers = 19"), "stages' layers sum to 31; the model has 32"),
        (('gpu = "h100-sxm-80gb"\ntp = 4', 'gpu = "b200"\ntp = 4'), "stage 1: gpu 'b200' is not a kind of the cluster"),
        (("tp = 4 }", "tp = 3 }"), "stage 0 replica 0: tp 3 does not divide the model's 32 heads"),
        (("dp = 2", "dp = 20"), "the plan puts 84 GPUs on h100-sxm-80gb; the cluster has 16"),
        (("micro_batch = 1", "micro_batch = 1\ntp = 2"), "tp is set by the plan's structure"),
        (('balance = "speed"', 'balance = "fast"'), "balance must be one of equal, speed"),
        (("count = 2 }", "count = 0 }"), "stage 0 replica 1: count must be an integer >= 1"),
        (("layers = 12", "layers = 12\nfoo = 1"), "stage 0: unknown key 'foo'"),
        (("micro_batch = 1", 'micro_batch = "one"'), "micro_batch must be a positive integer"),
        (("micro_batch = 1", 'micro_batch = 1\nrecompute = "half"'), "recompute must be one of none, selective, full"),
        (('balance = "speed"', 'balance = "equal"'), "stage 0: 64 micro-batches do not split equally over its 3"),
        (
            ('global_batch = 64\nmicro_batch = 1\nbalance = "speed"', 'global_batch = 2\nbalance = "equal"'),
            "stage 0: 2 micro-batches for 3 replicas leave a replica without one",
        ),
    ],
)
def test_bad_plan_files_name_the_stage_and_field(tmp_path, catalog, edit, message):
    path = tmp_path / "plan.toml"
    path.write_text('cluster = "a100-sxm-80gb:8,h100-sxm-80gb:16"\n' + PLAN.replace(*edit))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("'", "'")) as err:
        hp = hplan.read_plan_file(path)
        hplan.check(hp, catalog.model("llama2-7b"), hplan.parse_cluster_counts(hp.cluster), str(path))
    assert str(path) in str(err.value) or "plan" in str(err.value)


def test_a_plan_files_cluster_is_checked_where_it_is_read(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text('cluster = "a100-sxm-80gb:0,h100-sxm-80gb:16"\n' + PLAN)
    with pytest.raises(ValueError, match="must be KIND:COUNT with a positive count") as err:
        hplan.read_plan_file(path)
    assert str(err.value).startswith(f"{path}: cluster: 'a100-sxm-80gb:0'")


def test_cli_evaluates_a_plan_file_and_refuses_bad_ones(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(PLAN)
    res = run(["evaluate", "--model", "llama2-7b", "--plan", str(path), "--json"])
    assert res.exit_code == 0, res.stdout
    import json

    out = json.loads(res.stdout)
    assert out["feasible"] and out["plan"]["n_gpus"] == 16
    assert {(r["stage"], r["gpu"]) for r in out["stages"]} == {(0, A100), (0, H100), (1, H100)}
    bad = tmp_path / "bad.toml"
    bad.write_text(PLAN.replace("layers = 20", "layers = 2"))
    assert_user_error(run(["evaluate", "--model", "llama2-7b", "--plan", str(bad)]), str(bad), "layers")
    assert_user_error(run(["evaluate", "--model", "llama2-7b", "--plan", str(path), "--gpu", H100]), "--plan", "--gpu")
    assert_user_error(run(["evaluate", "--model", "llama2-7b", "--plan", str(path), "--tp", "2"]), "--tp", "--plan")
    assert_user_error(
        run(["evaluate", "--model", "llama2-7b", "--plan", str(path), "--global-batch", "32"]), "--global-batch", "64"
    )


def test_shorthand_stage_across_two_kinds_and_per_stage_layers(catalog):
    """``--cluster`` whose stages straddle two kinds is data parallelism across kinds inside a
    stage; ``--layers-per-stage`` is one per stage (or per group) in both modes, and a wrong total
    says so."""
    base = ["evaluate", "--model", "llama2-7b", "--global-batch", "64", "--json"]
    straddle = [*base, "--cluster", f"{A100}:4,{H100}:12", "--gpus", "16", "--tp", "2", "--pp", "2"]
    res = run(straddle)
    assert res.exit_code == 0, res.stdout
    import json

    rows = json.loads(res.stdout)["stages"]
    assert {r["gpu"] for r in rows if r["stage"] == 0} == {A100, H100}
    res = run([*straddle, "--layers-per-stage", "12", "--layers-per-stage", "20"])
    assert res.exit_code == 0, res.stdout
    assert [r["layers"] for r in json.loads(res.stdout)["stages"] if r["gpu"] == A100] == [12]
    commas = run([*straddle, "--layers-per-stage", "12,20"])  # one flag, a comma-separated list
    assert commas.exit_code == 0, commas.stdout
    assert json.loads(commas.stdout)["stages"] == json.loads(res.stdout)["stages"]
    assert_user_error(run([*straddle, "--layers-per-stage", "12,x"]), "--layers-per-stage", "'x'")
    assert_user_error(run([*straddle, "--layers-per-stage", "12", "--layers-per-stage", "19"]), "layers", "32")
    tp_across = [*base, "--cluster", f"{A100}:2,{H100}:6", "--gpus", "8", "--tp", "4"]
    assert_user_error(run(tp_across), "replica", "span")
    data = [*base, "--cluster", f"{A100}:8,{H100}:8", "--gpus", "16", "--tp", "4", "--pp", "2", "--hetero", "data"]
    res = run([*data, "--layers-per-stage", "10", "--layers-per-stage", "22"])
    assert res.exit_code == 0, res.stdout
    assert sorted({r["layers"] for r in json.loads(res.stdout)["stages"]}) == [10, 22]


# --------------------------------------------------------------------------------------------
# The published mixed-GPU systems' plans, written in the plan format
# --------------------------------------------------------------------------------------------

PLANS = Path(__file__).parent / "data" / "plans"
PAPER_MODELS = {  # dimensions as each plan's source states them (see the files' headers)
    "amp": dict(layers=24, hidden=1024, heads=16, vocab=50304, mlp="plain", seq_len=1024),  # GPT-2 medium, TP 1
    "sailor": dict(layers=24, hidden=1024, heads=16, vocab=50272, mlp="plain", seq_len=2048),  # OPT-350M
    "metis": dict(layers=8, hidden=4096, heads=32, vocab=51200, mlp="plain", seq_len=1024),  # Metis' GPT "1.5B"
    "flashflex": dict(layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096),  # Llama-2 7B
}


@pytest.mark.parametrize("system", sorted(PAPER_MODELS))
def test_every_published_mixed_gpu_plan_is_written_in_the_plan_format(system, cal):
    """AMP (rank-ordered stages over V100 and T4 nodes), Sailor (stages whose TP-8 replicas sit on
    two kinds each), Metis (a stage with T4 and A100 replicas sharing the batch by speed) and
    FlashFlex (four copies of a ten-stage pipeline with its own layer split) all parse, pass the
    checks against the model and their cluster, and run."""
    from hetersim.catalog import load_catalog, model_from_dims

    catalog = load_catalog([PLANS / "kinds.toml"])
    hp = hplan.read_plan_file(PLANS / f"{system}.toml")
    dims = PAPER_MODELS[system]
    entry = model_from_dims(**dims)
    counts = hplan.parse_cluster_counts(hp.cluster)
    hplan.check(hp, entry, counts, system)
    assert hp.gpus() == counts  # every GPU of the paper's cluster has its place
    m = build.model_spec(entry)
    hs = hsim.hetero_spec(hp, catalog, counts, shape=(2, 12, 2))
    out = _sim_plan()(m, hs, hsim.common_plan(hp, dims["seq_len"]), cal)
    layout = Infeasible.LAYERS_DIVIDE | Infeasible.BATCH_DIVIDE | Infeasible.GPU_COUNT | Infeasible.HEADS_DIVIDE
    layout = int(layout | Infeasible.PRECISION | Infeasible.KERNEL)
    assert int(out.total.infeasible) & layout == 0, Infeasible.describe(int(out.total.infeasible))
    assert 0 < float(out.total.step_time_s) < 1e4 and 0 < float(out.total.mfu) < 1
    kinds_per_stage = [{r.gpu for r in s.replicas} for p in hp.pipelines for s in p.stages]
    if system in ("sailor", "metis"):
        assert len(kinds_per_stage[0]) == 2  # data parallelism across kinds inside a stage
    if system == "flashflex":
        assert hp.pipelines[0].count == 4 and len(hp.pipelines[0].stages) == 10


# --------------------------------------------------------------------------------------------
# The search that picks the plan
# --------------------------------------------------------------------------------------------

MIX = [(A100, 4, 8), (H100, 4, 8)]


def test_candidates_cover_the_published_plan_shapes_and_all_pass_the_checks(catalog):
    from hetersim import hsearch

    model = catalog.model("llama2-7b")
    plans = hsearch.candidates(MIX, model, dict(global_batch=64))
    shapes = {(len(p.pipelines), max(len(s.replicas) for q in p.pipelines for s in q.stages)) for p in plans}
    assert (1, 1) in shapes  # stages by kind
    assert any(j > 1 for j, _ in shapes)  # pipelines by kind
    assert any(r > 1 for _, r in shapes)  # a rank-ordered stage with replicas of both kinds
    assert any(p.kinds() == [H100] for p in plans)  # a kind may be left out
    for p in plans:
        hplan.check(p, model, {A100: 4, H100: 4})
        assert all(n <= 4 for n in p.gpus().values())
    assert len({hsearch.describe(p) for p in plans}) == len(plans)


def test_the_search_picks_a_plan_no_slower_than_the_fast_kind_alone_and_writes_it(tmp_path, catalog, cal):
    """Leaving the slow kind out is in the space, so the best mixed plan is never slower than the
    fast kind's best; the chosen plan written as a file evaluates to the same step time."""
    from hetersim import hsearch

    model = catalog.model("llama2-7b")
    rows, ranked, res, n = hsearch.search(model, MIX, catalog, cal, dict(global_batch=64), 4096, top=3)
    assert rows[0]["infeasible"] == 0 and n == len(ranked)
    fast_only = [i for i, p in enumerate(hsearch.candidates(MIX, model, dict(global_batch=64))) if p.kinds() == [H100]]
    best_fast = min(res["step_time_s"][i] for i in fast_only if res["infeasible"][i] == 0)
    assert rows[0]["step_time_s"] <= best_fast * (1 + 1e-6)
    assert [r["step_time_s"] for r in rows] == sorted(r["step_time_s"] for r in rows)
    out = tmp_path / "best.toml"
    args = ["plan", "--model", "llama2-7b", "--cluster", f"{A100}:4,{H100}:4", "--global-batch", "64", "--top", "2"]
    res_cli = run([*args, "--out", str(out)])
    assert res_cli.exit_code == 0, res_cli.stderr
    again = hplan.read_plan_file(out)
    assert all(s.layers is not None for p in again.pipelines for s in p.stages)  # the balanced split, written out
    import json

    ev = json.loads(run(["evaluate", "--model", "llama2-7b", "--plan", str(out), "--json"]).stdout)
    assert ev["step_time_s"] == pytest.approx(rows[0]["step_time_s"], rel=1e-5)


def test_bad_plan_search_input(tmp_path):
    base = ["plan", "--model", "llama2-7b", "--global-batch", "64"]
    assert_user_error(run(base), "--cluster")
    assert_user_error(run([*base, "--cluster", f"{A100}:0"]), "positive count")
    assert_user_error(run([*base, "--cluster", f"{A100}:4", "--top", "0"]), "--top")
    study = tmp_path / "s.toml"
    study.write_text(
        'name = "x"\nmodel = "llama2-7b"\nclusters = ["a100-sxm-80gb:4"]\nfoo = 1\n[plan]\nglobal_batch = 8\n'
    )
    assert_user_error(run(["plan", "--study", str(study), "--out", str(tmp_path / "o")]), str(study), "foo")
    study.write_text(
        'name = "x"\nmodel = "llama2-7b"\nclusters = ["a100-sxm-80gb:4"]\n[plan]\nglobal_batch = 8\ntp = 2\n'
    )
    assert_user_error(run(["plan", "--study", str(study), "--out", str(tmp_path / "o")]), "plan.tp")
    assert not (tmp_path / "o").exists()


def test_a_budget_buys_whole_nodes_within_it_and_bad_budget_flags_are_refused():
    from hetersim import hsearch

    kinds = [(A100, 2.7, 8), (H100, 6.155, 8)]
    mixes = hsearch.mixes_within(kinds, 200.0)
    price = {k: p for k, p, _ in kinds}
    assert mixes and all(0.85 * 200 <= sum(n * price[k] for k, n, _ in m) <= 200 for m in mixes)
    assert all(n % 8 == 0 for m in mixes for _, n, _ in m)
    assert any(len(m) == 2 for m in mixes) and any(len(m) == 1 for m in mixes)
    base = ["plan", "--model", "llama2-7b", "--global-batch", "64"]
    assert_user_error(run([*base, "--budget", "100"]), "--budget", "--kinds")
    assert_user_error(
        run([*base, "--budget", "100", "--kinds", A100, "--cluster", f"{A100}:8"]), "--cluster", "--budget"
    )
    assert_user_error(run([*base, "--budget", "-1", "--kinds", A100]), "--budget")
