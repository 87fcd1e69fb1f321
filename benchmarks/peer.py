"""The peer: HF transformers' PyTorch BertForPreTraining, timed as bert_jax.benchmark times ours.

  python benchmarks/peer.py --model=large --seq=128 --batch=128 [--compile] [--steps=20]
      [--sweep=32,64,128 | --sweep=double]

Same work per step as `python -m bert_jax.benchmark`: the paper model (dropout 0.1 on hidden
states and attention probabilities, segments, NSP), AdamW (torch's fused kernel) with global-norm
clipping, bf16 autocast over fp32 master weights, SDPA attention with the padding mask, random
full-length rows with `predictions` masked positions (labels -100 elsewhere; HF's head computes
logits at every position, which is how the peer runs). Prints one JSON line per shape: seq/s,
tokens/s, MFU against a bf16 matmul peak measured in the same process, peak memory, and the SM
clock and power under the timed steps and under the peak (bert_jax.tools.gpu_clocks), warm-up and
timed steps as benchmarks/harness.time_steps runs them.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable-next=g-import-not-at-top,wrong-import-position
from benchmarks import harness
from bert_jax.tools import gpu_clocks  # pylint: disable=g-import-not-at-top,wrong-import-position

SIZES = {  # layers, hidden, heads, intermediate
    'base': (12, 768, 12, 3072),
    'large': (24, 1024, 16, 4096),
}
VOCAB = 30522


def model_flops_per_sequence(layers, hidden, intermediate, seq, predictions, vocab=VOCAB):
  """DESIGN.md's formula, as bert_jax.train.metrics computes it (same constants)."""
  from bert_jax.train import metrics  # pylint: disable=g-import-not-at-top
  from configs import base  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.model.update(num_layers=layers, hidden_size=hidden, intermediate_size=intermediate,
                      vocab_size=vocab)
  config.data.update(max_seq_length=seq, max_predictions_per_seq=predictions)
  return metrics.model_flops_per_sequence(config)


def matmul_peak(torch, n=8192, repeats=20, trials=5):
  """As bert_jax.train.metrics.measure_peak_flops: the best of `trials` timings of `repeats` matmuls."""
  a = torch.randn(n, n, device='cuda', dtype=torch.bfloat16)
  b = torch.randn(n, n, device='cuda', dtype=torch.bfloat16)
  for _ in range(3):
    a @ b
  torch.cuda.synchronize()
  best = 0.0
  for _ in range(trials):
    start = time.perf_counter()
    for _ in range(repeats):
      a @ b
    torch.cuda.synchronize()
    best = max(best, 2 * n**3 * repeats / (time.perf_counter() - start))
  return best


def run(args, torch, transformers, peak, peak_clocks=None):
  layers, hidden, heads, intermediate = SIZES[args.model]
  config = transformers.BertConfig(
      vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
      intermediate_size=intermediate, hidden_dropout_prob=args.dropout,
      attention_probs_dropout_prob=args.attention_dropout, max_position_embeddings=512,
      attn_implementation='sdpa')
  model = transformers.BertForPreTraining(config).cuda().train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6,
                                weight_decay=0.01, fused=True)
  b, s, p = args.batch, args.seq, args.predictions
  g = torch.Generator(device='cuda').manual_seed(0)
  input_ids = torch.randint(5, VOCAB, (b, s), device='cuda', generator=g)
  token_type_ids = (torch.arange(s, device='cuda')[None] >= s // 2).long().expand(b, s)
  attention_mask = torch.ones(b, s, dtype=torch.long, device='cuda')
  labels = torch.full((b, s), -100, dtype=torch.long, device='cuda')
  positions = torch.argsort(torch.rand(b, s - 1, device='cuda', generator=g), dim=1)[:, :p] + 1
  labels.scatter_(1, positions, torch.randint(5, VOCAB, (b, p), device='cuda', generator=g))
  nsp = torch.randint(0, 2, (b,), device='cuda', generator=g)

  def step():
    with torch.autocast('cuda', dtype=torch.bfloat16):
      loss = model(input_ids=input_ids, token_type_ids=token_type_ids,
                   attention_mask=attention_mask, labels=labels, next_sentence_label=nsp).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss

  if args.compile:
    step = torch.compile(step)
  torch.cuda.reset_peak_memory_stats()
  timing = harness.time_steps(step, lambda _: torch.cuda.synchronize(), args.warmup, args.steps)
  seconds, loss = timing.seconds_per_step, timing.last
  seq_per_s = b / seconds
  flops = model_flops_per_sequence(layers, hidden, intermediate, s, p)
  from bert_jax.train import metrics  # pylint: disable=g-import-not-at-top
  device = torch.cuda.get_device_name()
  return {
      'peer': 'transformers BertForPreTraining', 'mode': 'torch.compile' if args.compile else 'eager',
      'device': device, 'model': args.model, 'batch': b, 'seq': s,
      'predictions': p, 'dropout': args.dropout, 'attention_dropout': args.attention_dropout,
      'step_ms': 1000 * seconds, 'seq_per_s': seq_per_s, 'tokens_per_s': seq_per_s * s,
      'mfu': seq_per_s * flops / peak, 'peak_flops_per_device': peak,
      **metrics.peak_fields(device, peak, seq_per_s * flops),
      'peak_memory_bytes': torch.cuda.max_memory_allocated(),
      'warmup_seconds': timing.warmup_seconds, 'clocks': timing.clocks, 'peak_clocks': peak_clocks,
      'loss': float(loss), 'torch': torch.__version__, 'transformers': transformers.__version__,
  }


def run_child(args: list[str]) -> subprocess.CompletedProcess:
  """This script with ARGS in a fresh process (a clean GPU and its own peak memory)."""
  return subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True,
                        text=True, check=False)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', choices=sorted(SIZES), default='large')
  parser.add_argument('--seq', type=int, default=128)
  parser.add_argument('--batch', type=int, default=128)
  parser.add_argument('--predictions', type=int, default=0, help='0: 20 at 128, 80 at 512.')
  parser.add_argument('--dropout', type=float, default=0.1)
  parser.add_argument('--attention_dropout', type=float, default=0.1)
  parser.add_argument('--compile', action='store_true')
  parser.add_argument('--steps', type=int, default=20)
  parser.add_argument('--warmup', type=int, default=5)
  parser.add_argument('--sweep', default='', help="Batch sizes, each in its own process: "
                      "'32,64,128', or 'double' (--batch, doubled until out of memory), as "
                      "bert_jax.benchmark's --sweep; ends with largest_batch_that_fits.")
  args = parser.parse_args(argv)
  args.predictions = args.predictions or (80 if args.seq >= 512 else 20)
  if args.sweep:
    from bert_jax.tools import benchmark  # pylint: disable=g-import-not-at-top
    try:
      benchmark.sweep_batches(args.sweep)
    except ValueError as e:
      parser.error(str(e))
    argv = sys.argv[1:] if argv is None else argv
    benchmark.sweep(benchmark.flags_without_sweep(argv), args.sweep, args.batch,
                    child=run_child, batch_flag='--batch')
    return
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.backends.cuda.matmul.allow_tf32 = True
  with gpu_clocks.ClockSampler() as peak_clocks:
    peak = matmul_peak(torch)
  print(json.dumps(run(args, torch, transformers, peak, peak_clocks.summary())), flush=True)


if __name__ == '__main__':
  main()
