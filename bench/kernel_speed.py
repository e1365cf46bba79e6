"""MLA prefill kernel benchmark: TFLOP/s of every runnable backend on R1 prefill shapes.

Why: measured selection (issue 6) needs numbers, and numbers need a ceiling to be
read against, so each run also times a bf16 8192^3 matmul in the same process.

    python3 -m bench.kernel_speed --out bench/results/h200/kernels.json
    python3 -m bench.kernel_speed --backends CUDNN,FLASH_ATTN --out part-a.json
    python3 -m bench.kernel_speed --merge part-a.json part-b.json --out kernels.json

Each entry carries ``backend``, ``impl``, ``shape``, ``median_ms`` and ``tflops``
(causal FLOPs = sum of S^2 * H * (d_qk + d_v)); unavailable backends are listed
with their reason instead. ``--deadline`` stops starting new entries after that many
seconds, so a run on a lent GPU always ends with a file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from mla_switchboard import kernels
from mla_switchboard.kernels import R1_DIMS
from mla_switchboard.kernels.base import BackendUnavailable
from mla_switchboard.kernels.measure import benchmark, matmul_tflops

# (label, seqlens, heads): the R1 prefill shapes of issue 5, plus one ragged batch.
SHAPES: list[tuple[str, list[int], int]] = [
    ("4x4096 H16", [4096] * 4, 16),
    ("1x4096 H128", [4096], 128),
    ("1x16384 H16", [16384], 16),
    ("ragged 1,37,256,513,4096 H128", [1, 37, 256, 513, 4096], 128),
]
# (backend, create options): the default path of each backend first, then variants.
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("FLASHINFER", {}),
    ("CUDNN", {}),
    ("FLASH_ATTN", {}),
    ("TORCH_SDPA", {}),
    ("TRTLLM_RAGGED", {}),
]
EXTRA_VARIANTS: list[tuple[str, dict[str, Any]]] = [("FLASHINFER", {"impl": "fa2"})]
QUICK_SHAPES: list[tuple[str, list[int], int]] = [("quick 2x64 H2", [64, 64], 2)]
SLOW = {"TORCH_SDPA"}  # fp32 reference: few iterations are plenty


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("torch", "flashinfer-python", "nvidia-cudnn-frontend", "flash-attn", "triton"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def machine_info() -> dict[str, Any]:
    """Name the machine: GPU, capability, driver-facing versions, host, date."""
    info: dict[str, Any] = {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "packages": _versions(),
        "torch_cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=torch.cuda.get_device_name(0),
            capability=list(torch.cuda.get_device_capability(0)),
            sm_count=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            cudnn_backend=torch.backends.cudnn.version(),
        )
        major, minor = info["capability"]
        info["name"] = f"{info['gpu']} (SM{major}{minor}), torch {torch.__version__}"
    else:
        info["gpu"] = None
    return info


def run(
    backends: list[str],
    *,
    extra: bool,
    warmup: int,
    iters: int,
    deadline_s: float,
    dtype: str,
    shapes: list[tuple[str, list[int], int]] = SHAPES,
) -> dict[str, Any]:
    start = time.monotonic()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    doc: dict[str, Any] = {
        "machine": machine_info(),
        "workload": (
            "MLA prefill, DeepSeek-R1 dims (qk 128+64, v 128), causal self-attention, "
            f"{dtype}, ragged packed inputs through the kernels.* contract, no LSE"
        ),
        "flops": "sum over sequences of S^2 * H * (d_qk + d_v)",
        "timing": f"CUDA events per call, median of {iters} after {warmup} warm-up calls",
        "ceiling": [],
        "results": [],
        "unavailable": [],
    }
    if device == "cuda":
        doc["ceiling"].append(matmul_tflops(8192, dtype="bfloat16", device=device))
        print(f"bf16 matmul 8192^3: {doc['ceiling'][0]['tflops']:.1f} TFLOP/s", flush=True)
    variants = [v for v in VARIANTS + (EXTRA_VARIANTS if extra else []) if v[0] in backends]
    for backend, options in variants:
        for label, seqlens, heads in shapes:
            if time.monotonic() - start > deadline_s:
                doc["unavailable"].append(
                    {"backend": backend, "options": options, "shape": label, "reason": "deadline"}
                )
                continue
            try:
                inst = kernels.get(backend).create(
                    heads,
                    R1_DIMS.qk_nope_head_dim,
                    R1_DIMS.qk_rope_head_dim,
                    R1_DIMS.v_head_dim,
                    1.0 / math.sqrt(R1_DIMS.qk_head_dim),
                    dtype,
                    device,
                    **options,
                )
            except (BackendUnavailable, ImportError) as exc:
                doc["unavailable"].append(
                    {"backend": backend, "options": options, "reason": str(exc)}
                )
                print(f"{backend} {options}: unavailable: {exc}", flush=True)
                break  # same reason for every shape
            slow = backend in SLOW
            try:
                res = benchmark(
                    inst,
                    seqlens=seqlens,
                    num_heads=heads,
                    dtype=dtype,
                    device=device,
                    warmup=1 if slow else warmup,
                    iters=3 if slow else iters,
                )
            except Exception as exc:  # record and go on: one broken path must not end the run
                doc["unavailable"].append(
                    {"backend": backend, "options": options, "shape": label, "reason": repr(exc)}
                )
                print(f"{backend} {options} {label}: failed: {exc!r}", flush=True)
                continue
            entry = res.to_json()
            entry["shape"]["label"] = label
            entry["options"] = options
            doc["results"].append(entry)
            print(
                f"{backend:<14} {res.impl:<22} {label:<30} "
                f"{res.median_ms:9.3f} ms {res.tflops:7.1f} TFLOP/s",
                flush=True,
            )
            del inst
            if device == "cuda":
                torch.cuda.empty_cache()
    doc["elapsed_s"] = round(time.monotonic() - start, 1)
    return doc


def merge(paths: list[Path]) -> dict[str, Any]:
    """Combine partial runs (one per carried package set) into one result file."""
    docs = [json.loads(p.read_text()) for p in paths]
    merged = dict(docs[0])
    merged["parts"] = [
        {"file": p.name, "machine": d["machine"]} for p, d in zip(paths, docs, strict=True)
    ]
    for key in ("ceiling", "results", "unavailable"):
        merged[key] = [item for d in docs for item in d.get(key, [])]
    return merged


def table(doc: dict[str, Any]) -> str:
    """The results as a plain-text table, grouped by shape."""
    rows = [f"{'shape':<30} {'backend':<14} {'impl':<24} {'median ms':>10} {'TFLOP/s':>8}"]
    order = {label: i for i, (label, _, _) in enumerate(SHAPES)}
    results = sorted(
        doc["results"], key=lambda r: (order.get(r["shape"]["label"], 99), -r["tflops"])
    )
    for r in results:
        rows.append(
            f"{r['shape']['label']:<30} {r['backend']:<14} {r['impl']:<24} "
            f"{r['median_ms']:>10.3f} {r['tflops']:>8.1f}"
        )
    for c in doc.get("ceiling", []):
        rows.append(f"{'ceiling: ' + c['impl'] + ' 8192^3':<70} {c['tflops']:>8.1f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(b for b, _ in VARIANTS))
    parser.add_argument("--extra", action="store_true", help="also FlashInfer's fa2 path")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--deadline", type=float, default=math.inf, help="seconds")
    parser.add_argument("--quick", action="store_true", help="one tiny shape (smoke test)")
    parser.add_argument("--merge", nargs="+", type=Path, help="partial JSON files to combine")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.merge:
        doc = merge(args.merge)
    else:
        backends = [b.strip().upper() for b in args.backends.split(",") if b.strip()]
        doc = run(
            backends,
            extra=args.extra,
            warmup=args.warmup,
            iters=args.iters,
            deadline_s=args.deadline,
            dtype=args.dtype,
            shapes=QUICK_SHAPES if args.quick else SHAPES,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
