"""MLA prefill kernel benchmark: every wrapper against its library's own call, same run.

Why: measured selection times the wrappers, so a wrapper's overhead decides
rankings unless it is negligible. For every runnable backend and shape,
with and without ``return_lse``, this times the wrapper's ``prefill`` (``median_ms``)
and the library called directly (``direct_ms``: FlashInfer planned once, ``run``
only; vLLM's ``flash_attn_varlen_func``; PyTorch's ``_flash_attention_forward``;
cuDNN's ragged and dense graphs for exactly this batch, the faster counting), their
``ratio``, and the host time per call of each (``host_us``, ``direct_host_us``). Each
run also times a bf16 8192^3 matmul in the same process: the ceiling.

    python3 -m bench.kernel_speed --out bench/results/h200/kernels.json
    python3 -m bench.kernel_speed --backends CUDNN,FLASH_ATTN --out part-a.json
    python3 -m bench.kernel_speed --merge part-a.json part-b.json --out kernels.json
    python3 -m bench.kernel_speed --render bench/results/h200/kernels.json  # chart only

Causal FLOPs = sum of S^2 * H * (d_qk + d_v). Unavailable backends are listed with
their reason instead. ``--deadline`` stops starting new entries after that many
seconds, so a run on a lent GPU always ends with a file. The chart (TFLOP/s per
backend and shape, wrapper beside direct, the matmul ceiling as a line) goes next to
the JSON as ``<out>.png`` when matplotlib is importable.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import importlib.metadata
import json
import math
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

try:  # the chart renderer needs no torch: --render works anywhere
    import torch
    from mla_switchboard import kernels
    from mla_switchboard.kernels import R1_DIMS
    from mla_switchboard.kernels.base import BackendUnavailable
    from mla_switchboard.kernels.measure import benchmark, compare_direct, matmul_tflops
except ImportError:  # pragma: no cover - rendering-only environments
    torch = None  # type: ignore[assignment]

# (label, seqlens, heads): DeepSeek-R1 prefill chunks.
SHAPES: list[tuple[str, list[int], int]] = [
    ("8x512 H16", [512] * 8, 16),
    ("16x1024 H16", [1024] * 16, 16),
    ("4x4096 H16", [4096] * 4, 16),
    ("1x16384 H16", [16384], 16),
    ("1x8192 H128", [8192], 128),
    ("2x2048 H128", [2048] * 2, 128),
    # One ragged batch, lengths 1, 37, 256, 513, 4096:
    # CUDNN runs its ragged graph here, and its direct call is the ragged graph.
    ("ragged5 H128", [1, 37, 256, 513, 4096], 128),
]
# (backend, create options): each backend's default path, then forced variants.
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("FLASHINFER", {}),
    ("FLASH_ATTN", {}),
    ("FLASH_ATTN", {"impl": "torch-bundled-fa2"}),
    ("CUDNN", {}),
    ("TORCH_SDPA", {}),
    ("TRTLLM_RAGGED", {}),
    ("TOKENSPEED_MLA", {}),
]
EXTRA_VARIANTS: list[tuple[str, dict[str, Any]]] = [("FLASHINFER", {"impl": "fa2"})]
QUICK_SHAPES: list[tuple[str, list[int], int]] = [("quick 2x64 H2", [64, 64], 2)]
SLOW = {"TORCH_SDPA"}  # fp32 reference, no library call: three timed calls, no LSE pass


def _versions() -> dict[str, str]:
    """The installed version of every kernel package's distribution, every serving
    engine's and Triton's: what the results were measured with."""
    # The registries, read here: --render runs where mla_switchboard may be absent.
    from mla_switchboard.core.engine_names import detection_order
    from mla_switchboard.core.specs import KERNEL_PACKAGES

    engines = [e.distribution for e in detection_order() if e.distribution is not None]
    named = [p.distributions for p in KERNEL_PACKAGES.values()]
    out = {}
    # a package's first distribution name found only: flash-attn and flash_attn are
    # one distribution to importlib.metadata, and would be recorded twice
    for names in (*named, *((d,) for d in (*engines, "triton"))):
        for dist in names:
            try:
                out[dist] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    for dist in engines:
        if dist in out:
            continue
        # bench/gpu_run.sh carries only vllm_flash_attn, under a stub that names it
        with contextlib.suppress(Exception):
            out[dist] = str(importlib.import_module(dist).__version__)
    return out


def _nvidia_smi() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        res = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() or None


def machine_info() -> dict[str, Any]:
    """Name the machine: GPU, capability, driver, package versions, host, date."""
    info: dict[str, Any] = {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "packages": _versions(),
        "torch_cuda": torch.version.cuda,
        "nvidia_smi": _nvidia_smi(),
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
        info["name"] = f"{platform.machine()} CPU, torch {torch.__version__}"
    return info


def _create(backend: str, heads: int, dtype: str, device: str, options: dict[str, Any]) -> Any:
    return kernels.get(backend).create(
        heads,
        R1_DIMS.qk_nope_head_dim,
        R1_DIMS.qk_rope_head_dim,
        R1_DIMS.v_head_dim,
        1.0 / math.sqrt(R1_DIMS.qk_head_dim),
        dtype,
        device,
        **options,
    )


def run(
    backends: list[str],
    *,
    extra: bool,
    warmup: int,
    iters: int,
    rounds: int,
    deadline_s: float,
    dtype: str,
    shapes: list[tuple[str, list[int], int]] = SHAPES,
    lse_options: tuple[bool, ...] = (False, True),
) -> dict[str, Any]:
    start = time.monotonic()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    doc: dict[str, Any] = {
        "machine": machine_info(),
        "workload": (
            "MLA prefill, DeepSeek-R1 dims (qk 128+64, v 128), causal self-attention, "
            f"{dtype}, ragged packed inputs through the kernels.* contract, with and "
            "without return_lse"
        ),
        "flops": "sum over sequences of S^2 * H * (d_qk + d_v)",
        "timing": (
            f"CUDA events per call, calls issued back to back as the layers of a forward "
            f"pass are (3 queued untimed first); wrapper and direct calls alternate in "
            f"{rounds} rounds of {iters}; medians over all rounds, after {warmup} warm-up "
            "calls. host_us: median host wall time of one call (GPU time excluded)."
        ),
        "ceiling": [],
        "results": [],
        "unavailable": [],
    }
    if device == "cuda":
        doc["ceiling"].append(matmul_tflops(8192, dtype="bfloat16", device=device))
        print(f"bf16 matmul 8192^3: {doc['ceiling'][0]['tflops']:.1f} TFLOP/s", flush=True)
    variants = [v for v in VARIANTS + (EXTRA_VARIANTS if extra else []) if v[0] in backends]
    seen_impls: set[tuple[str, str]] = set()
    for backend, options in variants:
        instances: dict[int, Any] = {}
        skip_variant = False
        for label, seqlens, heads in shapes:
            if skip_variant:
                break
            if heads not in instances:
                try:
                    instances[heads] = _create(backend, heads, dtype, device, options)
                except (BackendUnavailable, ImportError) as exc:
                    doc["unavailable"].append(
                        {"backend": backend, "options": options, "reason": str(exc)}
                    )
                    print(f"{backend} {options}: unavailable: {exc}", flush=True)
                    break  # same reason for every shape
                impl = instances[heads].impl
                if options and len(instances) == 1 and (backend, impl) in seen_impls:
                    print(f"{backend} {options}: same path as the default ({impl})", flush=True)
                    skip_variant = True
                    break
                seen_impls.add((backend, impl))
            inst = instances[heads]
            for return_lse in lse_options if backend not in SLOW else (False,):
                if time.monotonic() - start > deadline_s:
                    doc["unavailable"].append(
                        {
                            "backend": backend,
                            "options": options,
                            "shape": label,
                            "return_lse": return_lse,
                            "reason": "deadline",
                        }
                    )
                    continue
                try:
                    if backend in SLOW:
                        res = benchmark(
                            inst,
                            seqlens=seqlens,
                            num_heads=heads,
                            dtype=dtype,
                            device=device,
                            warmup=1,
                            iters=3,
                        ).to_json()
                        res.update(
                            direct={},
                            direct_best=None,
                            direct_ms=None,
                            direct_tflops=None,
                            ratio=None,
                            host_us=None,
                            direct_host_us=None,
                            host_overhead_us=None,
                        )
                    else:
                        res = compare_direct(
                            inst,
                            seqlens=seqlens,
                            num_heads=heads,
                            dtype=dtype,
                            device=device,
                            return_lse=return_lse,
                            warmup=warmup,
                            iters=iters,
                            rounds=rounds,
                        ).to_json()
                except Exception as exc:  # record and go on: one broken path must not end it
                    doc["unavailable"].append(
                        {
                            "backend": backend,
                            "options": options,
                            "shape": label,
                            "return_lse": return_lse,
                            "reason": repr(exc),
                        }
                    )
                    print(f"{backend} {options} {label}: failed: {exc!r}", flush=True)
                    continue
                res["shape"]["label"] = label
                res["options"] = options
                doc["results"].append(res)
                print(_row(res), flush=True)
        del instances
        if device == "cuda":
            torch.cuda.empty_cache()
    doc["elapsed_s"] = round(time.monotonic() - start, 1)
    return doc


def _fmt(x: float | None, spec: str) -> str:
    return format(x, spec) if x is not None else "-"


def _row(r: dict[str, Any]) -> str:
    return (
        f"{r['shape']['label']:<13} {'lse' if r['shape'].get('return_lse') else '   '} "
        f"{r['backend']:<11} {r['impl']:<20} {r['median_ms']:8.3f} "
        f"{_fmt(r.get('direct_ms'), '8.3f')} {_fmt(r.get('ratio'), '6.3f')} "
        f"{r['tflops']:7.1f} {_fmt(r.get('direct_tflops'), '7.1f')} "
        f"{_fmt(r.get('host_us'), '6.1f')} {_fmt(r.get('host_overhead_us'), '6.1f')}"
    )


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
    rows = [
        f"{'shape':<13} lse {'backend':<11} {'impl':<20} {'wrap ms':>8} {'dir ms':>8} "
        f"{'ratio':>6} {'TFLOP/s':>7} {'dir TF':>7} {'host':>6} {'+host':>6}"
    ]
    order = {label: i for i, (label, _, _) in enumerate(SHAPES)}
    results = sorted(
        doc["results"],
        key=lambda r: (
            order.get(r["shape"]["label"], 99),
            bool(r["shape"].get("return_lse")),
            -r["tflops"],
        ),
    )
    rows += [_row(r) for r in results]
    for c in doc.get("ceiling", []):
        rows.append(f"ceiling: {c['impl']} 8192^3 {c['tflops']:.1f} TFLOP/s")
    worst = [r for r in results if r.get("ratio") is not None]
    if worst:
        w = max(worst, key=lambda r: r["ratio"])
        h = max(worst, key=lambda r: r["host_overhead_us"])
        rows.append(
            f"worst ratio {w['ratio']:.3f} ({w['backend']} {w['shape']['label']}); "
            f"most host overhead {h['host_overhead_us']:.1f} us ({h['backend']} "
            f"{h['shape']['label']})"
        )
    return "\n".join(rows)


def render_chart(doc: dict[str, Any], path: Path) -> bool:
    """TFLOP/s per backend and shape, wrapper beside direct, the matmul ceiling a line.

    One panel without LSE and one with. Returns False (and says why) when
    matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        print(f"chart skipped: {exc}")
        return False
    labels = [label for label, _, _ in SHAPES]
    results = [r for r in doc["results"] if r["shape"]["label"] in labels]
    series = sorted(
        {(r["backend"], r["impl"]) for r in results},
        key=lambda bi: -max(r["tflops"] for r in results if (r["backend"], r["impl"]) == bi),
    )
    ceiling = max((c["tflops"] for c in doc.get("ceiling", [])), default=None)
    colors = plt.get_cmap("tab10").colors
    fig, axes = plt.subplots(2, 1, figsize=(13, 10), sharex=True)
    width = 0.8 / max(1, 2 * len(series))
    for ax, lse in zip(axes, (False, True), strict=True):
        for si, (backend, impl) in enumerate(series):
            rows = {
                r["shape"]["label"]: r
                for r in results
                if (r["backend"], r["impl"]) == (backend, impl)
                and bool(r["shape"].get("return_lse")) == lse
            }
            for kind, hatch, alpha in (("wrapper", None, 1.0), ("direct", "//", 0.45)):
                xs, ys = [], []
                for xi, label in enumerate(labels):
                    r = rows.get(label)
                    y = (
                        None
                        if r is None
                        else r["tflops"]
                        if kind == "wrapper"
                        else r.get("direct_tflops")
                    )
                    if y is not None:
                        xs.append(xi - 0.4 + width * (2 * si + (kind == "direct")) + width / 2)
                        ys.append(y)
                if xs:
                    ax.bar(
                        xs,
                        ys,
                        width,
                        color=colors[si % len(colors)],
                        alpha=alpha,
                        hatch=hatch,
                        edgecolor="black",
                        linewidth=0.3,
                        label=f"{backend} ({impl})" + (" direct" if kind == "direct" else ""),
                    )
        if ceiling:
            ax.axhline(ceiling, color="black", linestyle="--", linewidth=1)
            ax.text(
                len(labels) - 0.5,
                ceiling,
                f"bf16 matmul {ceiling:.0f}",
                ha="right",
                va="bottom",
                fontsize=8,
            )
        ax.set_ylabel("TFLOP/s")
        ax.set_title(
            ("with" if lse else "without") + " return_lse: wrapper (solid) vs direct library "
            "call (hatched)"
        )
        ax.grid(axis="y", alpha=0.3)
    axes[1].set_xticks(range(len(labels)), labels)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, ncol=4, loc="lower center")
    machine = doc.get("machine", {})
    fig.suptitle(
        f"MLA prefill (DeepSeek-R1 dims, bf16, causal) on {machine.get('name', '?')}, "
        f"{machine.get('date_utc', '')[:10]}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(dict.fromkeys(b for b, _ in VARIANTS)))
    parser.add_argument("--extra", action="store_true", help="also FlashInfer's fa2 path")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-lse", action="store_true", help="skip the return_lse pass")
    parser.add_argument("--deadline", type=float, default=math.inf, help="seconds")
    parser.add_argument("--quick", action="store_true", help="one tiny shape (smoke test)")
    parser.add_argument("--merge", nargs="+", type=Path, help="partial JSON files to combine")
    parser.add_argument("--render", type=Path, help="only render the chart of this JSON")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.render:
        doc = json.loads(args.render.read_text())
        print(table(doc))
        return 0 if render_chart(doc, args.render.with_suffix(".png")) else 1
    if args.out is None:
        parser.error("--out is required")
    if args.merge:
        doc = merge(args.merge)
    else:
        if torch is None:
            parser.error("torch is not installed")
        backends = [b.strip().upper() for b in args.backends.split(",") if b.strip()]
        doc = run(
            backends,
            extra=args.extra,
            warmup=args.warmup,
            iters=args.iters,
            rounds=args.rounds,
            deadline_s=args.deadline,
            dtype=args.dtype,
            shapes=QUICK_SHAPES if args.quick else SHAPES,
            lse_options=(False,) if args.no_lse else (False, True),
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    print(f"wrote {args.out}")
    if not args.quick:
        render_chart(doc, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
