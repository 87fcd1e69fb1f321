#!/usr/bin/env bash
# Ours vs transformers' PyTorch fine-tuning of the same checkpoint on GLUE, back to back on one
# machine, same rows, batch order and hyperparameters; writes OUT/compare.json (both medians and
# every seed) beside each run's logs.
#
#   experiments/finetune_compare.sh HF_DIR DATA_DIR OUT_DIR [TASK ...]   (default: mrpc sst2)
#   env: LR (5e-5) SEEDS (3) EPOCHS (3) BATCH (32) SEQ (128)
set -euo pipefail
hf=$1 data=$2 out=$3
shift 3
tasks=${*:-mrpc sst2}
lr=${LR:-5e-5} seeds=${SEEDS:-3} epochs=${EPOCHS:-3} batch=${BATCH:-32} seq=${SEQ:-128}
declare -A folder=([cola]=CoLA [sst2]=SST-2 [mrpc]=MRPC [stsb]=STS-B [qnli]=QNLI [rte]=RTE)
mkdir -p "$out"
for task in $tasks; do
  BERT_JAX_DATA=$data python3 -m bert_jax.main \
    --config="configs/glue.py:task=$task,init=hf:$hf,seeds=$seeds,lr=$lr,epochs=$epochs,batch=$batch,seq=$seq" \
    --workdir="$out/jax_$task" --config.task.write_predictions=False >"$out/jax_$task.log" 2>&1
  python3 experiments/finetune_peer.py --model="$hf" --task="$task" \
    --data_dir="$data/glue/${folder[$task]}" --seeds="$seeds" --lr="$lr" --epochs="$epochs" \
    --batch="$batch" --seq="$seq" --out="$out/peer_$task.json" >"$out/peer_$task.log" 2>&1
  python3 - "$out" "$task" <<'PY'
import json, os, sys
out, task = sys.argv[1:]
ours = json.load(open(os.path.join(out, f'jax_{task}', 'results.json')))
peer = json.load(open(os.path.join(out, f'peer_{task}.json')))
path = os.path.join(out, 'compare.json')
table = json.load(open(path)) if os.path.exists(path) else {}
table[task] = {
    'ours': {'median': ours['median']['dev'], 'per_seed': ours['per_seed']['dev'],
             'train_seq_per_s': ours['train_seq_per_s']},
    'peer': {'median': peer['median'], 'per_seed': [r['metrics'] for r in peer['runs']],
             'train_seq_per_s': [r['train_seq_per_s'] for r in peer['runs']],
             'framework': peer['framework'], 'device': peer['device']},
    'settings': {k: ours[k] for k in ('num_steps', 'epochs', 'batch_size', 'learning_rate',
                                      'max_seq_length', 'init_from')}}
json.dump(table, open(path, 'w'), indent=2)
print(task, 'ours', ours['median']['dev'], 'peer', peer['median'])
PY
done
