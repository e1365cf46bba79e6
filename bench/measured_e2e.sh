#!/usr/bin/env bash
# Measured selection end to end on one machine:
#
#   service on loopback -> agent token -> fleet policy "measured"
#   -> `switchboard bench` as two pods (>= 2 pods, >= 3 samples a backend)
#   -> `switchboard select` for DeepSeek-R1 answers from the evidence
#   -> the same pod under the seed priority rules, for comparison.
#
#   bash bench/measured_e2e.sh            # on the lent H200 (device tool), or here on CPU
#
# On the GPU machine (Python 3.12, no network) the service's packages travel as
# wheels: .whl/ (flashinfer, cudnn frontend, ...) and .whl3/ (pydantic, fastapi,
# starlette, uvicorn, sqlalchemy, alembic, ...); carry both. They are installed to
# /tmp/site only under Python 3.12, so a CPU dry run here uses the local packages;
# without CUDA only TORCH_SDPA runs and nothing becomes GPU evidence, but every step
# (service, tokens, policy, reports, select, summary, the result file) still runs.
# Everything lands in $OUT (default /tmp/measured-e2e): measured_e2e.json (the
# result), bench-pod-a.json, bench-pod-b.json, summary.json, e2e.log, service.log.
set -uo pipefail
out=${OUT:-/tmp/measured-e2e}
mkdir -p "$out"
exec > >(tee -a "$out/e2e.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export FLASHINFER_CUDA_ARCH_LIST="${FLASHINFER_CUDA_ARCH_LIST:-9.0a}"  # JIT for SM90 only
model=${MODEL:-tests/agent/configs/deepseek-v3.json}  # DeepSeek-R1 has V3's architecture
model_name=${MODEL_NAME:-deepseek-ai/DeepSeek-R1}
budget_a=${BUDGET_A:-420}  # the first pod pays FlashInfer's JIT (1-3.5 min on an H200)
budget_b=${BUDGET_B:-240}
port=${PORT:-18080}
url="http://127.0.0.1:$port"
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

if [ -d .whl ] && python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
  stamp "installing wheels to /tmp/site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl .whl3/*.whl || exit 3
  export PYTHONPATH=/tmp/site
fi

work=$(mktemp -d)
admin="e2e-admin-$(python3 -c 'import secrets; print(secrets.token_hex(12))')"
stamp "service on $url, database $work/sb.db"
SWITCHBOARD_DATABASE_URL="sqlite:///$work/sb.db" SWITCHBOARD_ADMIN_TOKEN="$admin" \
  python3 -m mla_switchboard.service.cli serve --host 127.0.0.1 --port "$port" --log-level warning \
  >"$out/service.log" 2>&1 &
svc=$!
trap 'kill "$svc" 2>/dev/null; wait "$svc" 2>/dev/null' EXIT

# api METHOD PATH [JSON] [TOKEN]: one HTTP call, body to stdout, non-2xx fails.
api() {
  python3 - "$url" "$@" <<'EOF'
import json, sys, httpx
url, method, path = sys.argv[1:4]
body = json.loads(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] else None
token = sys.argv[5]
r = httpx.request(method, url + path, json=body, timeout=30,
                  headers={"Authorization": f"Bearer {token}"})
print(r.text)
sys.exit(0 if r.is_success else f"{method} {path}: HTTP {r.status_code}: {r.text[:500]}")
EOF
}

python3 - "$url" <<'EOF' || { cat "$out/service.log"; exit 4; }
import sys, time, httpx
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        if httpx.get(sys.argv[1] + "/readyz", timeout=1).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(0.2)
sys.exit("service not ready in 60 s")
EOF

stamp "agent token, fleet policy measured, seed-comparison cluster on priority"
agent=$(api POST /v1/tokens '{"name": "e2e-pods", "role": "agent"}' "$admin" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])') || exit 5
api PUT '/v1/overrides/*' '{"policy": "measured", "note": "e2e: the fleet measures"}' \
  "$admin" >/dev/null || exit 5
api PUT /v1/overrides/e2e-seed '{"policy": "priority", "note": "e2e: seed rules"}' \
  "$admin" >/dev/null || exit 5
export SWITCHBOARD_TOKEN="$agent"

common=(--model "$model" --model-name "$model_name" --cluster e2e --url "$url" --format json)
for pod in a b; do
  budget=$budget_a
  [ "$pod" = b ] && budget=$budget_b
  stamp "switchboard bench as pod e2e-pod-$pod (budget ${budget}s)"
  python3 -m mla_switchboard.cli bench "${common[@]}" --pod "e2e-pod-$pod" --node "$(hostname)" \
    --budget "$budget" >"$out/bench-pod-$pod.json"
  echo "exit $?"
done

stamp "switchboard select (cluster e2e: measured) and the same pod on the seed rules"
sel=(--model "$model" --model-name "$model_name" --url "$url" --no-cache --deadline 10)
python3 -m mla_switchboard.cli select "${sel[@]}" --cluster e2e --pod e2e-pod-c --format json \
  >"$work/select.json"
echo "exit $?"
python3 -m mla_switchboard.cli select "${sel[@]}" --cluster e2e-seed --pod e2e-pod-c --format json \
  >"$work/seed.json"
echo "exit $?"
api GET /v1/measurements/summary '' "$admin" >"$out/summary.json" || exit 6

stamp "result"
python3 - "$out" "$work" <<'EOF'
import datetime as dt, json, platform, statistics, subprocess, sys
from pathlib import Path

out, work = Path(sys.argv[1]), Path(sys.argv[2])
KERNEL_PACKAGES = ("torch", "flash_attn", "flashinfer", "cudnn")  # core/evidence.py
load = lambda p: json.loads(p.read_text()) if p.exists() and p.read_text().strip() else None
pods = {p: load(out / f"bench-pod-{p}.json") for p in "ab"}
chosen, seed, summary = load(work / "select.json"), load(work / "seed.json"), load(out / "summary.json")
first = next((d for d in pods.values() if d), None) or {}
device = first.get("device") or {}
packages = first.get("packages") or {}

# the summary's groups for this exact situation (what /v1/select ranked)
groups = [
    g for g in (summary or {}).get("groups", [])
    if g["device"] == (device.get("name") or "")
    and g["capability"] == ".".join(map(str, device.get("capability") or []))
    and g["dtype"] == first.get("dtype")
    and g["packages"] == {k: v for k, v in packages.items() if k in KERNEL_PACKAGES}
    and g["dims"] == [first["model"][k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")]
] if first else []
by_backend = {g["backend"]: g for g in groups}

backends = {}
for pod, doc in pods.items():
    for r in (doc or {}).get("results", []):
        b = backends.setdefault(r["backend"], {"impl": r["impl"], "correct": True, "shapes": {}, "errors": []})
        b["correct"] &= bool(r["correct"])
        if r["error"]:
            b["errors"].append(r["error"])
        label = f'{len(r["shape"]["seqlens"])}x{r["shape"]["seqlens"][0]} H{r["shape"]["num_heads"]}'
        b["shapes"].setdefault(label, {})[f"pod-{pod}"] = r["tflops"]
for name, b in backends.items():
    g = by_backend.get(name, {})
    b["median_tflops"] = g.get("median_tflops")
    b["samples"], b["pods"], b["failures"] = g.get("samples"), g.get("pods"), g.get("failures")
    b["errors"] = sorted(set(b["errors"]))[:3]
    for label, per_pod in b["shapes"].items():
        vals = [v for v in per_pod.values() if v is not None]
        per_pod["median"] = statistics.median(vals) if vals else None

fastest = max(
    (n for n, b in backends.items() if b["correct"] and b["median_tflops"] is not None),
    key=lambda n: backends[n]["median_tflops"], default=None,
)
tf = lambda name: (backends.get(name) or {}).get("median_tflops")
pick = (chosen or {}).get("backend")
seed_pick = (seed or {}).get("backend")
ratio = tf(pick) / tf(seed_pick) if tf(pick) and tf(seed_pick) else None
per_shape = {}
for label in (backends.get(pick) or {}).get("shapes", {}):
    a = backends[pick]["shapes"][label].get("median")
    s = ((backends.get(seed_pick) or {}).get("shapes", {}).get(label) or {}).get("median")
    per_shape[label] = {"chosen": a, "seed": s, "ratio": a / s if a and s else None}

def smi() -> str | None:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None

result = {
    "what": "measured selection end to end: service on loopback, `switchboard bench` as two pods, "
            "fleet policy measured, then `switchboard select` for DeepSeek-R1",
    "machine": {"gpu": device.get("name"), "capability": device.get("capability"),
                "nvidia_smi": smi(), "host": platform.node(), "python": platform.python_version(),
                "packages": packages},
    "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    "model": first.get("model"), "dtype": first.get("dtype"),
    "shapes": first.get("shapes"),
    "pods": {p: {"elapsed_s": (d or {}).get("elapsed_s"), "skipped": len((d or {}).get("skipped", [])),
                 "report": (d or {}).get("report")} for p, d in pods.items()},
    "backends": backends,
    "unavailable": first.get("unavailable"),
    "fastest_correct": fastest,
    "chosen": {"backend": pick, "source": (chosen or {}).get("source"),
               "tflops": tf(pick), "evidence": (chosen or {}).get("evidence"),
               "messages": (chosen or {}).get("messages")},
    "seed": {"backend": seed_pick, "source": (seed or {}).get("source"), "tflops": tf(seed_pick),
             "messages": (seed or {}).get("messages")},
    "chosen_over_seed": ratio,
    "per_shape": per_shape,
    "chosen_is_fastest_correct": pick is not None and pick == fastest,
    "tflops_note": "median over every correct result of both pods and both shapes "
                   "(the service's median_tflops for the situation); causal FLOPs = "
                   "sum of S^2 * H * (d_qk + d_v)",
}
(out / "measured_e2e.json").write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps({k: result[k] for k in ("fastest_correct", "chosen", "seed", "chosen_over_seed",
                                          "per_shape", "chosen_is_fastest_correct")}, indent=2))
for name, b in sorted(backends.items(), key=lambda kv: -(kv[1]["median_tflops"] or 0)):
    print(f"{name:14} {b['impl'] or '-':22} correct={b['correct']!s:5} "
          f"median={b['median_tflops']} samples={b['samples']} pods={b['pods']}")
EOF
stamp "done"
