#!/usr/bin/env bash
# One cell of the PathQuestion generalisation grid (docs/results/pathquestion-grid.md):
# the tiny CPU recipe on one set and split, end to end, evaluated in every decoding mode.
#   1. the GAT ranker on the split's training questions (configs/ranker.yaml);
#   2. warm-up trajectories with the line templates (configs/tiny-cpu/templates-line.yaml), entity
#      handles, the ranker in the tool, top_k 10, relation ids printed as words;
#   3. a tiny model from configs/tiny-cpu/model-1m.yaml, its word tokenizer learned from the KB and the
#      warm-up;
#   4. SFT for at most STEPS steps (configs/tiny-cpu/sft.yaml: dev loss every 100 steps, early stopping,
#      the best checkpoint kept);
#   5. GRPO from it, the demo's recipe (configs/tiny-cpu/grpo.yaml: 30 steps on all training questions,
#      15 on the hard cases, those episode 1 got partly or wholly wrong; lr 2e-5);
#   6. `kgreasoner eval` of both checkpoints on the test split: unconstrained (`off`), constrained
#      decoding after <search>/<answer> (`on`), and with constrained quotes as well (`quotes`).
#
#   bench/pathquestion_grid.sh SET SCHEME OUT STEPS      (SET: PQ-2H, PQ-3H, PQL-2H or PQL-3H;
#                                                         SCHEME: random or grouped)
#
# Environment: NICE (default 10). One torch thread per job (OMP_NUM_THREADS=1): several cells share the
# 2-core machine better than one cell with two threads.
# Output in OUT/: ranker/, warmup.jsonl, base/, sft/, grpo/, eval-{off,on,quotes}/, grpo-eval-{off,on,quotes}/
# (summary.md, summary.json, per-question JSONL), a log per stage, times.tsv (stage, wall, user and system
# CPU seconds; a stage killed part-way leaves no line). A stage whose output exists is skipped and SFT and
# GRPO continue from their last checkpoint, so a killed cell resumes; use a fresh OUT after changing a
# setting. `python bench/pathquestion_table.py OUT...` prints the grid's table.
set -euo pipefail

SET=${1:?usage: bench/pathquestion_grid.sh SET SCHEME OUT STEPS}
SCHEME=${2:?usage: bench/pathquestion_grid.sh SET SCHEME OUT STEPS}
OUT=${3:?usage: bench/pathquestion_grid.sh SET SCHEME OUT STEPS}
STEPS=${4:?usage: bench/pathquestion_grid.sh SET SCHEME OUT STEPS}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=(nice -n "${NICE:-10}" env OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 "${KGREASONER_PYTHON:-$REPO/.venv/bin/python}")
KG=("${PY[@]}" -m kgreasoner.cli)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$REPO"

stage() {  # stage NAME DONE COMMAND...: unless DONE exists, run COMMAND (output to OUT/NAME.log) and time it
    local name=$1 done=$2
    shift 2
    [ -e "$done" ] && return
    echo "== $SET $SCHEME: $name"
    local TIMEFORMAT="$name	%R	%U	%S"
    { time "$@" >"$OUT/$name.log" 2>&1; } 2>>"$OUT/times.tsv"
}

KB=$("${PY[@]}" -c "from kgreasoner.data import load_dataset; print(load_dataset('$SET').kb_path)")
TOOL=(--set tool.ranking=gat --set tool.ranker_path="$OUT/ranker" --set tool.entity_handles=true
      --set tool.top_k=10 --set tool.relation_format=words)
SPLIT=(--set split_scheme="$SCHEME" --set split_seed=0)

stage ranker "$OUT/ranker/ranker.json" "${PY[@]}" train/ranker.py --config configs/ranker.yaml \
    --set data="$SET" --set split_scheme="$SCHEME" --set split_seed=0 --set seed=0 --set out_dir="$OUT/ranker"
stage warmup "$OUT/warmup.jsonl" "${KG[@]}" warmup --config configs/tiny-cpu/warmup.yaml --set dataset="$SET" \
    "${SPLIT[@]}" --set seed=0 --set output="$OUT/warmup.jsonl" --set templates=configs/tiny-cpu/templates-line.yaml \
    --set progress=false "${TOOL[@]}"
stage build "$OUT/base" "${KG[@]}" build-tiny --config configs/tiny-cpu/model-1m.yaml --texts "$KB" \
    "$OUT/warmup.jsonl" --out "$OUT/base"
stage sft "$OUT/sft/final" "${PY[@]}" train/sft.py --resume --config configs/tiny-cpu/sft.yaml --set model="$OUT/base" \
    --set tiny_model=null --set train_file="$OUT/warmup.jsonl" --set run_dir="$OUT/sft" \
    --set trainer.max_steps="$STEPS" --set trainer.eval_steps=100 --set trainer.save_steps=100 --set trainer.seed=0
stage grpo "$OUT/grpo/episode-2/final" "${PY[@]}" train/grpo.py --resume --config configs/tiny-cpu/grpo.yaml \
    --set 'episodes=[{data: all, max_steps: 30}, {data: hard, max_steps: 15}]' --set trainer.save_steps=15 \
    --set model="$OUT/sft/final" --set dataset="$SET" "${SPLIT[@]}" --set trainer.seed=0 --set run_dir="$OUT/grpo" \
    --set guidance.trajectories="$OUT/warmup.jsonl" "${TOOL[@]}" \
    --set rollout.max_turns=6 --set rollout.max_new_tokens=320 --set rollout.max_turn_tokens=96

for model in sft grpo; do
    checkpoint=$OUT/sft/final prefix=eval
    [ "$model" = grpo ] && checkpoint=$OUT/grpo/episode-2/final prefix=grpo-eval
    for mode in off on quotes; do
        case $mode in
            off) decoding=(--set rollout.constrained_decoding=false) ;;
            on) decoding=(--set rollout.constrained_decoding=true) ;;
            quotes) decoding=(--set rollout.constrained_decoding=true --set rollout.constrained_quotes=true) ;;
        esac
        stage "$prefix-$mode" "$OUT/$prefix-$mode/summary.json" "${KG[@]}" eval --methods kgreasoner \
            --dataset "$SET" --split-scheme "$SCHEME" --split test --llm hf:"$checkpoint" --out "$OUT/$prefix-$mode" \
            --no-progress "${TOOL[@]}" "${decoding[@]}"
    done
done
echo "== $SET $SCHEME: stage, wall, user and system CPU seconds"
cat "$OUT/times.tsv"
