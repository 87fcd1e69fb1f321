#!/usr/bin/env bash
# Issue 78, item 1: does the early peak rate put ELECTRA-Small's discriminator at its edge?
# Eight runs side by side on one GPU, the shipped fast path: warmup 1,000 (the 10k-step recipe's)
# against warmup 10,000 (the paper's), decay over 10,000 steps, four init seeds each, each
# stopped by a time limit. Run from the repository root on the device (README of the device tool:
# wheels in .whl, the vocab and corpus under runs/issue78/data), e.g.
#   CORPUS="runs/issue78/data/corpus/enwiki-2015-wikiextractor/*.xz,runs/issue78/data/corpus/gutenberg/*.xz" \
#   LIMIT=470 bash experiments/electra_warmup.sh
# With CKPT=500 each run checkpoints every 500 steps, and the same command again on the still-warm
# machine (runs/ stays there between calls) resumes every run from its last checkpoint: two calls
# take the runs past the 2-4k steps where discriminators died. The runs live in OUTDIR
# (runs/electra_warmup), outside runs/issue78, which the device's carry replaces on each call.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$PWD/.site" .whl/*.whl
export PYTHONPATH="$PWD/.site:$PWD" XLA_PYTHON_CLIENT_PREALLOCATE=false \
  BERT_JAX_DATA="$PWD/runs/issue78/data"
W=${OUTDIR:-runs/electra_warmup}
CORPUS=${CORPUS:-builtin}
mkdir -p "$W/logs"
COMMON=(--config.objectives=rtd --config.model.name=electra --config.model.embedding_size=128
  --config.model.intermediate_size=1024 --config.model.generator_fraction=0.25
  --config.model.disc_weight=50.0 --config.masking.mask_token_fraction=0.85
  --config.masking.random_token_fraction=0.0 --config.masking.keep_fraction=0.15
  --config.train.adam_eps=1e-6 --config.train.eval_every=250
  --config.train.log_every=250 "--config.data.corpus=$CORPUS" --config.data.workers=0
  --config.masking.eval=reference "--config.train.checkpoint_every=${CKPT:-100000}")
LIMIT=${LIMIT:-480}
run() {
  local name=$1 warmup=$2 seed=$3 lr=$4
  timeout "$LIMIT" python3 -m bert_jax.main \
    "--config=configs/small.py:layers=12,hidden=256,heads=4,batch=128,steps=10000,warmup=$warmup" \
    "${COMMON[@]}" --config.train.learning_rate="$lr" --config.init_seed="$seed" \
    --workdir="$W/$name" > "$W/logs/$name.log" 2>&1 &
}
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt"
start=$(date +%s)
# SEEDS, WARMUPS and LRS (peak rates; the shipped 5e-4 by default) pick the arms (fewer runs
# side by side go further in the same time). A run of another peak rate is named by it.
for seed in ${SEEDS:-0 1 2 3}; do
  for warmup in ${WARMUPS:-1000 10000}; do
    for lr in ${LRS:-5e-4}; do
      name="w$((warmup / 1000))k_s$seed"
      [ "$lr" = 5e-4 ] || name="w$((warmup / 1000))k_lr${lr}_s$seed"
      run "$name" "$warmup" "$seed" "$lr"
    done
  done
done
wait
echo "runs took $(( $(date +%s) - start )) s" >> "$OUT/gpu.txt"
# One archive: the device returns a limited number of files.
mkdir -p "$W/out"
for d in "$W"/*/; do
  n=$(basename "$d"); cp "$d/metrics.jsonl" "$W/out/$n.metrics.jsonl" 2>/dev/null
done
grep -H "ALARM" "$W"/logs/*.log > "$W/out/alarms.txt" 2>/dev/null
cp "$W"/logs/*.log "$W/out/" 2>/dev/null
tar czf "$OUT/runs.tgz" -C "$W/out" .
exit 0
