"""HF transformers' ELECTRA pretrained on a bert_jax run's own batches: the reference curve.

    python benchmarks/electra_reference.py --workdir=RUN [--steps=N] [--log_every=100] \
        [--device=cuda] [--out=reference.jsonl]

RUN is an ELECTRA run's workdir (config.objectives='rtd'): its config.json gives the shapes, the
corpus (prepared or in memory), the masking and the optimizer, and its batches come from the same
input pipeline from the first step. The reference is ElectraForPreTraining (the discriminator)
and ElectraForMaskedLM at generator_shape's width (the generator) with the word, position and
segment embeddings and their LayerNorm shared and the generator's output tied to the word
embeddings, as google-research/electra's; a token is sampled from the generator's softmax at each
masked position without a gradient, a sample equal to the original counts as original, and the
loss is the generator's MLM loss + disc_weight x the discriminator's over the real tokens.
AdamW (decay off LayerNorm and biases), global-norm clipping, warmup + linear decay, as
bert_jax's optimizer; bf16 autocast on a GPU.

Each `--log_every` steps it prints (and appends to --out) a JSON line: the interval's mean
generator and discriminator losses, the discriminator's exact AUC and the replaced share over
the interval's real tokens, and seq/s: numbers to set beside the run's own metrics.jsonl.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.models import electra  # noqa: E402  pylint: disable=wrong-import-position
from bert_jax.train import optim  # noqa: E402  pylint: disable=wrong-import-position


def reference_models(model, device):
  """(discriminator, generator) of config.model's shapes, embeddings shared, on `device`."""
  import transformers  # pylint: disable=g-import-not-at-top
  common = dict(
      vocab_size=model.vocab_size, embedding_size=model.get('embedding_size', 0)
      or model.hidden_size, num_hidden_layers=model.num_layers,
      max_position_embeddings=model.max_position_embeddings,
      type_vocab_size=model.type_vocab_size, layer_norm_eps=model.layer_norm_eps,
      hidden_dropout_prob=model.hidden_dropout_rate,
      attention_probs_dropout_prob=model.attention_dropout_rate, hidden_act='gelu',
      initializer_range=model.initializer_range)
  shape = electra.generator_shape(model)
  disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(
      hidden_size=model.hidden_size, num_attention_heads=model.num_heads,
      intermediate_size=model.intermediate_size, **common)).to(device)
  gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
      hidden_size=shape['hidden_size'], num_attention_heads=shape['num_heads'],
      intermediate_size=shape['intermediate_size'], **common)).to(device)
  gen.electra.embeddings = disc.electra.embeddings
  gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
  return disc, gen


def exact_auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
  """P(a replaced token's score > an original one's), ties half; None without both kinds."""
  positives = int(labels.sum())
  negatives = len(labels) - positives
  if positives == 0 or negatives == 0:
    return None
  order = np.argsort(scores, kind='stable')
  sorted_scores = scores[order]
  # Average ranks (1-based) over ties.
  _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
  ranks = np.empty(len(scores))
  ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)
  return float((ranks[labels > 0].sum() - positives * (positives + 1) / 2)
               / (positives * negatives))


def corrupt(gen_logits, batch, generator):
  """Samples at the masked positions -> (corrupted ids, labels) [batch, length]."""
  import torch  # pylint: disable=g-import-not-at-top
  ids, mask = batch['input_ids'], batch['input_mask']
  positions, weights = batch['masked_lm_positions'], batch['masked_lm_weights']
  with torch.no_grad():
    probs = torch.softmax(gen_logits.float().flatten(0, 1), -1)  # [batch x predictions, vocab]
    sampled = torch.multinomial(probs, 1, generator=generator).view(positions.shape)
    rows = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(positions)
    real = weights > 0
    original, corrupted = ids.clone(), ids.clone()
    original[rows[real], positions[real]] = batch['masked_lm_ids'][real]
    corrupted[rows[real], positions[real]] = sampled[real]
    labels = ((corrupted != original) & (mask > 0)).float()
  return corrupted, labels


def train(config, workdir, steps, log_every, device, out=None, seed=0):
  """Trains the reference on the run's batches; returns the JSON records it printed."""
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  if config.objectives != 'rtd':
    raise ValueError(f'{workdir}: config.objectives={config.objectives!r}; the reference '
                     "trains ELECTRA runs only (objectives='rtd').")
  m, t = config.model, config.train
  batches = pretrain.prepare_data(config, workdir)[0].batches({'epoch': 0, 'batch': 0})
  torch.manual_seed(seed)
  generator = torch.Generator(device=device).manual_seed(seed)
  disc, gen = reference_models(m, device)
  named = {id(p): (n, p) for module in (disc, gen) for n, p in module.named_parameters()}
  no_decay = lambda n: 'LayerNorm' in n or n.endswith('bias')  # noqa: E731
  optimizer = torch.optim.AdamW(
      [{'params': [p for n, p in named.values() if not no_decay(n)],
        'weight_decay': t.weight_decay},
       {'params': [p for n, p in named.values() if no_decay(n)], 'weight_decay': 0.0}],
      lr=t.learning_rate, betas=(t.adam_b1, t.adam_b2), eps=t.adam_eps)
  # bert_jax's own schedule, as a multiplier of the peak.
  shape = optim.learning_rate_schedule(1.0, t.warmup_steps, t.num_steps)
  schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: float(shape(s)))
  autocast = torch.autocast(device_type='cuda', dtype=torch.bfloat16,
                            enabled=device.startswith('cuda'))
  records, interval = [], {'gen': 0.0, 'disc': 0.0, 'scores': [], 'labels': []}
  start = time.perf_counter()
  for step in range(1, steps + 1):
    batch = {k: torch.as_tensor(np.asarray(v)).to(device) for k, v in next(batches)[0].items()}
    mask = batch['input_mask'].long()
    inputs = {'attention_mask': mask, 'token_type_ids': batch['segment_ids'].long()}
    positions, weights = batch['masked_lm_positions'].long(), batch['masked_lm_weights'].float()
    batch.update(input_ids=batch['input_ids'].long(), masked_lm_positions=positions,
                 masked_lm_ids=batch['masked_lm_ids'].long(), masked_lm_weights=weights)
    with autocast:
      logits = gen(input_ids=batch['input_ids'], **inputs).logits  # [batch, length, vocab]
      logits = torch.gather(logits, 1, positions[..., None].expand(-1, -1, logits.shape[-1]))
      nll = F.cross_entropy(logits.float().flatten(0, 1), batch['masked_lm_ids'].flatten(),
                            reduction='none')
      gen_loss = (nll * weights.flatten()).sum() / (weights.sum() + 1e-5)
      corrupted, labels = corrupt(logits, batch, generator)
      disc_logits = disc(input_ids=corrupted, **inputs).logits.float()  # [batch, length]
      bce = F.binary_cross_entropy_with_logits(disc_logits, labels, reduction='none')
      disc_loss = (bce * mask).sum() / mask.sum()
      loss = gen_loss + m.disc_weight * disc_loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for _, p in named.values()], t.max_grad_norm)
    optimizer.step()
    schedule.step()
    real = mask.bool()
    interval['gen'] += gen_loss.item()
    interval['disc'] += disc_loss.item()
    interval['scores'].append(disc_logits.detach()[real].cpu().numpy())
    interval['labels'].append(labels[real].cpu().numpy())
    if step % log_every == 0 or step == steps:
      count = len(interval['scores'])
      scores, labels_ = np.concatenate(interval['scores']), np.concatenate(interval['labels'])
      record = {'step': step, 'gen_loss': interval['gen'] / count,
                'disc_loss': interval['disc'] / count, 'disc_auc': exact_auc(scores, labels_),
                'replaced_fraction': float(labels_.mean()),
                'learning_rate': schedule.get_last_lr()[0],
                'seq_per_s': count * mask.shape[0] / (time.perf_counter() - start)}
      records.append(record)
      print(json.dumps(record), flush=True)
      if out:
        with open(out, 'a', encoding='utf-8') as f:
          f.write(json.dumps(record) + '\n')
      interval = {'gen': 0.0, 'disc': 0.0, 'scores': [], 'labels': []}
      start = time.perf_counter()
  return records


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', required=True, help="An ELECTRA run's workdir.")
  parser.add_argument('--steps', type=int, default=0, help='0: the run\'s train.num_steps.')
  parser.add_argument('--log_every', type=int, default=100)
  parser.add_argument('--device', default='cpu')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  import ml_collections  # pylint: disable=g-import-not-at-top
  with open(os.path.join(args.workdir, 'config.json'), encoding='utf-8') as f:
    config = ml_collections.ConfigDict(json.load(f))
  train(config, args.workdir, args.steps or config.train.num_steps, args.log_every,
        args.device, args.out or None, args.seed)


if __name__ == '__main__':
  main()
