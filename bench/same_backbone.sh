#!/usr/bin/env bash
# Same-backbone comparison (the paper's Table 2 at our scale): ToG and SoG run by the
# same tiny architecture, trained with the same budget, as the kgreasoner SFT in
# docs/results/pathquestion.md. Per method:
#   1. SFT data for every LLM step of the method, answered by the gold-path teacher on the train
#      split (and 50 dev questions for SFT's best-checkpoint choice) of the grouped split
#      (`kgreasoner pipeline-sft`, configs/tiny-cpu/pipeline_sft.yaml: ToG without worked examples);
#   2. a tiny model from configs/tiny-cpu/model-1m.yaml, its word tokenizer learned from the set's
#      KB and those records (prompts included), as the kgreasoner runs learn theirs from KB + warm-up;
#   3. the records again with that tokenizer: over-long ones (> 1024 tokens, SFT's max_length) are
#      dropped and counted, token counts go in the summary;
#   4. SFT for STEPS steps, configs/tiny-cpu/sft.yaml with lr 3e-3, batch 16, dev loss every 50 steps
#      (the kgreasoner runs' settings);
#   5. `kgreasoner eval --methods METHOD` on the grouped test split with that checkpoint and the same
#      method settings as the data.
# Each method gets its own model and the whole STEPS budget, like the kgreasoner model.
#
#   bench/same_backbone.sh SET OUT STEPS      (SET: PQ-2H, PQ-3H, PQL-2H or PQL-3H)
#
# Environment: METHODS (default "tog sog"), NICE (default 10), SFT_SET (extra `KEY=VALUE` settings of the
# SFT, space-separated, e.g. "learning_rate=1e-3 early_stopping_patience=0"). One torch thread per job
# (OMP_NUM_THREADS=1): on the shared 2-core machine more threads made jobs 3-25x slower.
# Output per method in OUT/METHOD/: data.jsonl (+ .summary.json), base/, sft/, eval/ (summary.md,
# summary.json, per-question JSONL), times.txt (wall seconds per stage).
# Use a fresh OUT: the evaluation resumes what an OUT/METHOD/eval already holds.
# Measured here (PQ-2H, 150 steps; docs/results/same-backbone.md): 8.4 min in all; Hits@1 0.000 for
# both (under-trained: dev loss still falling steeply); per question ToG 2.7 calls / 259 prompt
# tokens, SoG 10 calls (the turn cap) / 5,273 prompt tokens.
set -euo pipefail

SET=${1:?usage: bench/same_backbone.sh SET OUT STEPS}
OUT=${2:?usage: bench/same_backbone.sh SET OUT STEPS}
STEPS=${3:?usage: bench/same_backbone.sh SET OUT STEPS}
METHODS=${METHODS:-tog sog}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=(nice -n "${NICE:-10}" env OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 "${KGREASONER_PYTHON:-$REPO/.venv/bin/python}")
KG=("${PY[@]}" -m kgreasoner.cli)
SFT_EXTRA=()
for setting in ${SFT_SET:-}; do SFT_EXTRA+=(--set "$setting"); done
cd "$REPO"

KB=$("${PY[@]}" -c "from kgreasoner.data import load_dataset; print(load_dataset('$SET').kb_path)")
# Method settings shared by the data and the evaluation: the prompts at evaluation must be the trained ones.
SETTINGS=(--set tog.few_shot=false)

stage() {  # stage NAME COMMAND...: run it, append its wall time to times.txt
    local name=$1 start=$SECONDS
    shift
    echo "== $METHOD: $name"
    "$@"
    echo "$name $((SECONDS - start))" >>"$DIR/times.txt"
}

for METHOD in $METHODS; do
    DIR=$OUT/$METHOD
    mkdir -p "$DIR"
    : >"$DIR/times.txt"
    DATA=(--config configs/tiny-cpu/pipeline_sft.yaml --set method="$METHOD" --set dataset="$SET"
          --set split_scheme=grouped --set output="$DIR/data.jsonl" --set progress=false "${SETTINGS[@]}")
    stage data "${KG[@]}" pipeline-sft "${DATA[@]}"
    stage build "${KG[@]}" build-tiny --config configs/tiny-cpu/model-1m.yaml --texts "$KB" "$DIR/data.jsonl" \
        --out "$DIR/base"
    stage filter "${KG[@]}" pipeline-sft "${DATA[@]}" --set tokenizer="$DIR/base" --set max_length=1024
    stage sft "${PY[@]}" train/sft.py --config configs/tiny-cpu/sft.yaml --set model="$DIR/base" --set tiny_model=null \
        --set train_file="$DIR/data.jsonl" --set run_dir="$DIR/sft" --set trainer.learning_rate=3e-3 \
        --set trainer.max_steps="$STEPS" --set trainer.eval_steps=50 --set trainer.save_steps=50 \
        --set trainer.max_length=1024 --set 'trainer.report_to=[]' \
        "${SFT_EXTRA[@]}"
    stage eval "${KG[@]}" eval --methods "$METHOD" --dataset "$SET" --split-scheme grouped --split test \
        --llm hf:"$DIR/sft/final" --out "$DIR/eval" --no-progress "${SETTINGS[@]}"
done

for METHOD in $METHODS; do
    echo "== $METHOD ($SET, grouped test, $STEPS SFT steps): wall seconds per stage"
    cat "$OUT/$METHOD/times.txt"
done
