"""The peer: transformers' PyTorch fine-tuning of the same checkpoint on the same GLUE rows.

Same features (our reader and tokenizer), same batch order (finetune.train_batches), same
hyperparameters (AdamW eps 1e-6, decay 0.01 off LayerNorm/bias, warmup share then linear decay,
clip 1.0, dropout 0.1), same metrics (bert_jax.tasks.scoring); only the framework differs, and the
head's init and dropout masks, which follow each framework's own seeded generator.

  python experiments/finetune_peer.py --model=DIR --task=sst2 --data_dir=.../glue/SST-2 \
      --seeds=3 --lr=5e-5 --epochs=3 --batch=32 --seq=128 --out=peer_sst2.json
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.train import finetune  # noqa: E402
from bert_jax.data import tokenizer as tokenizer_lib  # noqa: E402
from bert_jax.tasks import glue  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', required=True, help='HF model directory (config, weights, vocab).')
  parser.add_argument('--task', required=True)
  parser.add_argument('--data_dir', required=True)
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--lr', type=float, default=2e-5)
  parser.add_argument('--epochs', type=float, default=3.0)
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--seq', type=int, default=128)
  parser.add_argument('--warmup', type=float, default=0.1)
  parser.add_argument('--max_train_examples', type=int, default=0)
  parser.add_argument('--out', required=True)
  args = parser.parse_args()

  torch.backends.cuda.matmul.allow_tf32 = True  # As JAX's default fp32 matmul on GPUs.
  torch.backends.cudnn.allow_tf32 = True
  device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
  tokenizer = tokenizer_lib.WordPieceTokenizer(os.path.join(args.model, 'vocab.txt'), True)
  task = glue.GlueTask(args.task, data_dir=args.data_dir,
                       max_train_examples=args.max_train_examples)
  train = task.train_split(tokenizer, args.seq)
  dev = task.eval_splits(tokenizer, args.seq)['dev']
  steps_per_epoch = train.num_rows // args.batch
  num_steps = int(round(steps_per_epoch * args.epochs))
  keys = ('input_ids', 'segment_ids', 'input_mask', 'label')
  runs = []
  for seed in range(args.seed, args.seed + args.seeds):
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification.from_pretrained(
        args.model, num_labels=task.num_outputs, hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1).to(device)
    decay = [p for n, p in model.named_parameters() if not ('LayerNorm' in n or 'bias' in n)]
    no_decay = [p for n, p in model.named_parameters() if 'LayerNorm' in n or 'bias' in n]
    optimizer = torch.optim.AdamW([{'params': decay, 'weight_decay': 0.01},
                                   {'params': no_decay, 'weight_decay': 0.0}],
                                  lr=args.lr, eps=1e-6, fused=device.type == 'cuda')
    scheduler = transformers.get_linear_schedule_with_warmup(
        optimizer, int(args.warmup * num_steps), num_steps)
    model.train()
    step, start = 0, None
    while step < num_steps:
      epoch = step // steps_per_epoch
      for batch in finetune.train_batches({k: train.features[k] for k in keys}, args.batch,
                                          seed, epoch):
        if step == 1:
          torch.cuda.synchronize() if device.type == 'cuda' else None
          start = time.perf_counter()  # Step 0 warms up the kernels.
        t = {k: torch.from_numpy(np.asarray(v)).to(device) for k, v in batch.items()}
        labels = t['label'].long() if task.head == 'classification' else t['label'].float()
        out = model(input_ids=t['input_ids'].long(), token_type_ids=t['segment_ids'].long(),
                    attention_mask=t['input_mask'].long(), labels=labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step == num_steps:
          break
    if device.type == 'cuda':
      torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    model.eval()
    logits = []
    with torch.no_grad():
      for batch, count in finetune.padded_batches({k: dev.features[k] for k in keys[:3]}, 128):
        t = {k: torch.from_numpy(np.asarray(v)).to(device).long() for k, v in batch.items()}
        out = model(input_ids=t['input_ids'], token_type_ids=t['segment_ids'],
                    attention_mask=t['input_mask'])
        logits.append(out.logits.float().cpu().numpy()[:count])
    metrics, _ = task.score('dev', dev, {'logits': np.concatenate(logits)})
    runs.append({'seed': seed, 'metrics': metrics, 'train_seconds': seconds,
                 'train_seq_per_s': (num_steps - 1) * args.batch / seconds})
    print(json.dumps(runs[-1]), flush=True)
  median = {k: float(np.median([r['metrics'][k] for r in runs])) for k in runs[0]['metrics']}
  result = {'task': task.name, 'framework': f'torch {torch.__version__} + transformers '
            f'{transformers.__version__}', 'device': torch.cuda.get_device_name()
            if device.type == 'cuda' else 'cpu', 'median': median, 'runs': runs,
            'num_steps': num_steps, 'lr': args.lr, 'batch': args.batch, 'epochs': args.epochs,
            'seq': args.seq}
  with open(args.out, 'w', encoding='utf-8') as f:
    json.dump(result, f, indent=2)
  print(json.dumps({'task': task.name, 'median': median}))


if __name__ == '__main__':
  main()
