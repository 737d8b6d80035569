"""The model against AMP's measured heterogeneous trials: ``python benchmarks/amp_trials.py FILE``.

AMP (Li et al., NeurIPS 2022) publishes the 53 real trials of its heterogeneous experiment in
``src/results/het_cluster_results.txt`` of DachengLi1/AMP (commit 72eeea4): GPT-2 medium (24
layers, hidden 1024, 16 heads, sequence 1024, tied embeddings, fp16; GPT-2's 50,257 tokens padded
by Megatron to a multiple of 128 x TP: 50,304 / 50,432 / 50,688 at TP 1 / 2 / 4, AMP's
``megatron/tokenizer/tokenizer.py`` ``_vocab_size_with_padding`` with the default
``--make-vocab-size-divisible-by 128``; AMP's own cost model uses 52,256) on three
p3.8xlarge nodes (4 V100-16GB each, NVLink, 10 Gbps between nodes) and one g4dn.12xlarge (4 T4,
PCIe, 50 Gbps), global batch 32, ranks ordered tp, dp, pp (``amp_utils.axis2rank``), stage
boundaries indexing AMP's 30-entry layer list ``[embed, noop, 24 x layer, noop, noop, head,
noop]``. ``FILE`` is a copy of that file; nothing of it ships with HeterSim. With
``--homogeneous`` ``FILE`` is instead a copy of ``src/results/homogeneous_results.txt``, the 52
trials of AMP's homogeneous experiment: the same model and batch on four g4dn.12xlarge nodes (16 T4,
50 Gbps; ``src/homogeneous.py`` ``cluster_info`` and ``known_cost/gpt2_G4_*``).

This is a physics check, never a fitting target: it prints the step-time MAPE over the trials
that ran, the Spearman rank correlation of predicted and measured step time (and AMP's own),
the measured time of the plan the model ranks first against the best measured, and how many of
the failed trials (``r_cost: inf``) the model flags. A failed trial need not have run out of
memory: AMP's launcher kills a trial after 200 s of wall time, start-up and 41 iterations included
(``DS/launcher/launch.py`` l.178-184 at 72eeea4), so the count of failed trials the model flags or
prices slower than :data:`TIMEOUT_ITER_S` per iteration is printed too. The devices and networks come from
``tests/data/plans/kinds.toml`` (a user catalog file), the stack is ``deepspeed-2020`` (DeepSpeed
0.3's pipeline engine with Megatron-LM v1.1.5, which AMP vendors: every micro-batch's send carries
the fp16 ``[1, 1, s, s]`` attention mask from each TP rank, and each TP rank sends the whole
activation gradient back, ``is_grad_partitioned = False``, and Megatron-LM's optional softmax,
bias-GeLU and bias-dropout fusions are off, as AMP's launch script gives none of their flags;
``catalog/stacks.toml`` cites the lines;
``--stack deepspeed`` prices today's DeepSpeed instead) and gradients
are reduced in fp32, as AMP's ``examples/ds_config.json`` sets (``fp32_allreduce``); sequence
parallelism is off, which AMP's Megatron-LM v1.1.5 predates (it came with Korthikanti et al. 2022).

AMP's harness runs every transformer layer's forward twice: its pipeline layer first runs the
forward only to print the output's shape (``ParallelTransformerLayerPipe.forward``,
``megatron/model/transformer.py`` l.509 at 72eeea4: ``print((super().forward(*args)).shape)``,
then ``return super().forward(*args), attention_mask``). So each trial paid a second forward per
layer with its tensor-parallel all-reduces, which is what full recomputation adds to a step; by
default the trials' step times are priced with ``recompute = "full"`` for that, and their memory
(the failed trials flagged) with nothing recomputed, as they ran. ``--no-harness`` prices them as
DeepSpeed and Megatron-LM run without that line. ``--fragmentation F`` gives every trial an
allocator fragmentation allowance (the plan field; 0 by default, as the plan's default): with
GMLake's measured mean, 0.15, the failed trials that fit only because the caching allocator's
losses are left out are flagged, and it prints how many of the trials that ran it flags too.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRIAL = re.compile(
    r"Simulating result: None, \[([0-9, ]+)\], (\d+), \{'mp_deg': tensor\(\[(\d+)\.\]\), "
    r"'dp_deg': tensor\(\[(\d+)\.\]\), 'pp_deg': tensor\(\[(\d+)\.\]\)\}, with p_cost: "
    r"tensor\(\[([0-9.]+)\]\), r_cost: ([0-9.]+|inf)"
)
V100, T4 = "v100-16gb", "t4-16gb"
TIMEOUT_ITER_S = 200.0 / 41  # AMP's 200 s launcher limit over its 41 iterations (start-up left out)
FIRST_T4_RANK = 12  # nodes 0-2 are the p3.8xlarge nodes (src/het_cluster.py cluster_info)
N_GPUS = 16
STACK = "deepspeed-2020"  # AMP's DeepSpeed 0.3; --stack prices another


def trials(text: str) -> list[dict]:
    out = []
    for m in TRIAL.finditer(text):
        bounds, mbs, tp, dp, pp, amp, real = m.groups()
        out.append(
            dict(
                bounds=[int(x) for x in bounds.split(",")],
                micro_batch=int(mbs),
                tp=int(tp),
                dp=int(dp),
                pp=int(pp),
                amp_s=float(amp),
                measured_s=float(real),
            )
        )
    return out


def counts(first_t4: int) -> dict[str, int]:
    """GPUs of each kind: ranks below ``first_t4`` are V100s, the rest T4s."""
    return {k: n for k, n in ((V100, first_t4), (T4, N_GPUS - first_t4)) if n}


def plan_of(
    t: dict,
    grad_reduce: str,
    first_t4: int = FIRST_T4_RANK,
    recompute: str = "none",
    fragmentation: float = 0.0,
    stack: str = STACK,
):
    from hetersim import hplan

    stages = []
    for s in range(t["pp"]):
        lo, hi = t["bounds"][s], t["bounds"][s + 1]
        layers = sum(1 for e in range(lo, hi) if 2 <= e <= 25)  # entries 2..25 are the 24 layers
        reps: dict[str, int] = {}
        for r in range(t["dp"]):
            kind = V100 if s * t["tp"] * t["dp"] + r * t["tp"] < first_t4 else T4
            reps[kind] = reps.get(kind, 0) + 1
        stages.append(hplan.Stage(layers, tuple(hplan.Replica(k, t["tp"], n) for k, n in reps.items())))
    opts = dict(global_batch=32, micro_batch=t["micro_batch"], precision="fp16", stack=stack, sp=False)
    opts["recompute"] = recompute
    opts["fragmentation"] = fragmentation
    opts["grad_reduce"] = grad_reduce
    cluster = ",".join(f"{k}:{n}" for k, n in counts(first_t4).items())
    return hplan.HeteroPlan((hplan.Pipeline(tuple(stages)),), "equal", opts, cluster=cluster)


def padded_vocab(tp: int, tokens: int = 50257, multiple: int = 128) -> int:
    """Megatron's padded vocabulary: GPT-2's tokens rounded up to a multiple of 128 x TP."""
    step = multiple * tp
    return -(-tokens // step) * step


def spearman(a, b) -> float:
    ra, rb = (np.argsort(np.argsort(x)).astype(float) for x in (a, b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="a copy of AMP's src/results/het_cluster_results.txt")
    ap.add_argument("--grad-reduce", default="fp32", help="gradient reduction dtype (AMP's config: fp32)")
    ap.add_argument(
        "--homogeneous", action="store_true", help="FILE is AMP's homogeneous_results.txt (16 T4 on 4 g4dn nodes)"
    )
    ap.add_argument(
        "--no-harness", action="store_true", help="leave out AMP's second forward per layer (transformer.py l.509)"
    )
    ap.add_argument(
        "--fragmentation",
        type=float,
        default=0.0,
        help="allocator fragmentation allowance of every trial (the plan field; 0.15 is GMLake's mean)",
    )
    ap.add_argument("--stack", default=STACK, help="software-stack profile (default: AMP's DeepSpeed 0.3)")
    args = ap.parse_args()

    from hetersim import api, build, hsim
    from hetersim.catalog import load_catalog, model_from_dims

    catalog = load_catalog([ROOT / "tests" / "data" / "plans" / "kinds.toml"])
    dims = dict(layers=24, hidden=1024, heads=16, mlp="plain", seq_len=1024, tied_embeddings=True)
    models = {tp: build.model_spec(model_from_dims(**dims, vocab=padded_vocab(tp))) for tp in (1, 2, 4, 8)}
    cal = api.default_calibration()
    engine = api._compiled("plan")
    first_t4 = 0 if args.homogeneous else FIRST_T4_RANK
    cluster = counts(first_t4)
    rows = []
    for t in trials(args.results.read_text(encoding="utf-8")):
        outs = []
        for recompute in ("none",) if args.no_harness else ("none", "full"):
            hp = plan_of(t, args.grad_reduce, first_t4, recompute, args.fragmentation, args.stack)
            hs = hsim.hetero_spec(hp, catalog, cluster, shape=(2, 16, 2), kinds=[V100, T4])
            outs.append(engine(models[t["tp"]], hs, hsim.common_plan(hp, 1024), cal).total)
        as_ran, timed = outs[0], outs[-1]  # memory as the trial ran; time with the harness's second forward
        rows.append(dict(t, predicted_s=float(timed.step_time_s), flagged=int(as_ran.infeasible) != 0))
    ran = [r for r in rows if math.isfinite(r["measured_s"])]
    failed = [r for r in rows if not math.isfinite(r["measured_s"])]
    pred, meas = np.array([r["predicted_s"] for r in ran]), np.array([r["measured_s"] for r in ran])
    first = min((r for r in ran if not r["flagged"]), key=lambda r: r["predicted_s"])
    print(f"{len(rows)} trials, {len(ran)} ran, {len(failed)} failed")
    print("priced without AMP's second forward" if args.no_harness else "priced with AMP's second forward per layer")
    err = (pred - meas) / meas
    print(f"step-time MAPE {100 * np.mean(np.abs(err)):.1f}% (median error {100 * np.median(err):+.1f}%)")
    print(f"Spearman {spearman(pred, meas):.2f} (AMP's own model {spearman([r['amp_s'] for r in ran], meas):.2f})")
    print(f"the model's first plan took {first['measured_s']:.2f} s; the best measured {meas.min():.2f} s")
    print(f"failed trials flagged: {sum(r['flagged'] for r in failed)} of {len(failed)}")
    print(f"trials that ran flagged: {sum(r['flagged'] for r in ran)} of {len(ran)}")
    slow = sum(r["flagged"] or r["predicted_s"] > TIMEOUT_ITER_S for r in failed)
    print(f"failed trials flagged or over AMP's 200 s limit ({TIMEOUT_ITER_S:.2f} s per iteration): {slow}")


if __name__ == "__main__":
    main()
