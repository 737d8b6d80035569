"""The model against llm-foundry's MPT throughput tables: ``python benchmarks/foundry_tables.py FILE``.

llm-foundry publishes the throughput of its MPT models (125M-70B, sequences 512-65,536, 8-512
A100 40GB / A100 80GB / H100 80GB GPUs, PyTorch FSDP, with and without activation checkpointing)
in ``scripts/train/benchmarking/README.md`` of mosaicml/llm-foundry (tables of May 2023 - Jan 2024,
last changed at 495218376). ``FILE`` is a copy of that file; nothing of it ships with HeterSim.

This is a physics check, never a fitting target: it prints the step-time MAPE and mean error per
table and sequence band for two software-stack profiles, ``fsdp`` (eager Hugging Face-style modules
with PyTorch SDPA's FlashAttention-2) and ``llm-foundry`` (what those runs ran: Triton
FlashAttention, one 16-bit kernel per LayerNorm and GELU; ``catalog/stacks.toml``), and the share of
measurements inside the 80% prediction interval. Under ``llm-foundry`` the large-scale H100 table's
1b, 3b, 7b and 70b rows run FlashAttention-2, as they did (:data:`FLASH2_LARGE_SCALE`); its
varlen path's unpadding and padding of q, k, v and the output (flash_attn.bert_padding gathers and
scatters, llmfoundry/models/layers/attention.py flash_attn_fn @ 5e85bd62d) is not priced, about 40
bytes per token and hidden unit of a layer, some 3% of the 1b runs' step. The MPT architectures are the yamls'
(``scripts/train/yamls/pretrain/mpt-*.yaml``: d_model, n_heads, n_layers; expansion ratio 4,
vocabulary 50,368, GELU MLP); a step is ``GlobalBatchSize (T) / Throughput (T/s)``; FULL_SHARD is
ZeRO-3, SHARD_GRAD_OP ZeRO-2, activation checkpointing full recomputation.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

ARCH = {  # layers, d_model, heads (mpt-*.yaml)
    "125m": (12, 768, 12),
    "350m": (24, 1024, 16),
    "760m": (24, 1536, 12),
    "1b": (24, 2048, 16),
    "3b": (32, 2560, 20),
    "7b": (32, 4096, 32),
    "13b": (40, 5120, 40),
    "30b": (48, 7168, 56),
    "70b": (80, 8192, 64),
}
GPU = {"h100_80gb": "h100-sxm-80gb", "a100_80gb": "a100-sxm-80gb", "a100_40gb": "a100-sxm-40gb"}
# The large-scale H100 table (added at 5e85bd62d, Jan 2024) was run by scripts/train/benchmarking/
# sweep.py of that commit, which passes --attn_impl flash (flash-attn 2.4.2, the gpu-flash2 extra
# its submit script installs) for these models and --attn_impl triton for 13b and 30b; every other
# table ran sweep.sh, which passes none (submit_benchmarks.py's default, triton).
FLASH2_LARGE_SCALE = {"1b", "3b", "7b", "70b"}


def runs(text: str) -> list[dict]:
    """The table rows of the README: one dict per measured run."""
    out, table = [], ""
    for line in text.splitlines():
        if line.startswith("## "):
            table = line[3:].split(" with ")[0].replace(" (Large Scale, >= 128 GPUs)", " 128+").strip()
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or cells[0] not in ARCH:
            continue
        if len(cells) == 19:  # the A100 40GB table has no "Model TFLOP" column
            cells.insert(6, "")
        tokens = int(cells[13])
        out.append(
            dict(
                table=table,
                model=cells[0],
                seq=int(cells[1]),
                gpus=int(cells[2]),
                gpu=GPU[cells[3]],
                micro_batch=int(cells[7]),
                global_batch=int(cells[9]),
                precision=cells[14],
                zero=3 if cells[16] == "FULL_SHARD" else 2,
                recompute="full" if cells[17] == "True" else "none",
                measured_s=tokens / float(cells[11]),
            )  # fmt: skip
        )
    return out


def band(seq: int) -> str:
    return "<= 2k" if seq <= 2048 else "4k-8k" if seq <= 8192 else "16k" if seq <= 16384 else "32k-64k"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("readme", type=Path, help="a copy of llm-foundry's scripts/train/benchmarking/README.md")
    args = ap.parse_args()

    import hetersim
    from hetersim.api import step_time_interval
    from hetersim.catalog import load_catalog

    catalog = load_catalog()
    rows = runs(args.readme.read_text(encoding="utf-8"))
    for stack in ("fsdp", "llm-foundry"):
        errs: dict[tuple[str, str], list[float]] = defaultdict(list)
        inside = 0
        for r in rows:
            layers, hidden, heads = ARCH[r["model"]]
            model = dict(layers=layers, hidden=hidden, heads=heads, ffn_hidden=4 * hidden, vocab=50368, mlp="plain")
            plan = dict(n_gpus=r["gpus"], micro_batch=r["micro_batch"], global_batch=r["global_batch"],
                        seq_len=r["seq"], zero=r["zero"], recompute=r["recompute"], stack=stack,
                        precision="fp8" if "fp8" in r["precision"] else "bf16")  # fmt: skip
            if stack == "llm-foundry" and r["table"].endswith("128+") and r["model"] in FLASH2_LARGE_SCALE:
                plan["attention"] = "flash2"  # what these runs ran; the profile's default is Triton's
            pred = float(hetersim.evaluate(model, r["gpu"], **plan).step_time_s)
            lo, hi = step_time_interval(catalog, [catalog.gpu(r["gpu"])], plan, pred)
            inside += lo <= r["measured_s"] <= hi
            errs[r["table"], band(r["seq"])].append(100.0 * (pred / r["measured_s"] - 1.0))
        every = [e for v in errs.values() for e in v]
        print(f"stack {stack}: {len(every)} runs, MAPE {sum(map(abs, every)) / len(every):.1f}%, "
              f"mean error {sum(every) / len(every):+.1f}%, max {max(map(abs, every)):.1f}%, "
              f"80% interval coverage {100.0 * inside / len(every):.0f}%")  # fmt: skip
        for (table, b), v in sorted(errs.items()):
            mape, mean = sum(map(abs, v)) / len(v), sum(v) / len(v)
            print(f"  {table:16s} {b:8s} {len(v):3d} runs  MAPE {mape:5.1f}%  mean {mean:+6.1f}%")


if __name__ == "__main__":
    main()
