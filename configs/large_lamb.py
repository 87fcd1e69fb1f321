"""BERT-Large with LAMB at batch 65,536 (You et al., 2019: BERT in 76 minutes on 1,024 TPU v3 chips).

Phase 1 of their mixed-batch recipe: 7,038 steps of 65,536 sequences of 128 tokens, learning rate
6e-3 after 2,000 warmup steps (NVIDIA's published LAMB hyperparameters for this schedule).
Phase 2 (1,561 steps of 32,768 x 512, lr 4e-3, 200 warmup steps) is the argument `phase=2`,
run with --config.init_from=<phase-1 workdir> until two-phase configs land (issue 5).
"""

from configs import base, large

# remat: what the backward recomputes; phase 2 (16 sequences of 512 per v3 core) needs 'dots' to
# fit a core's 16 GiB (experiments/aot_results.md).
PHASES = {
    1: dict(batch=65_536, seq=128, predictions=20, steps=7_038, lr=6e-3, warmup=2_000,
            remat='none'),
    2: dict(batch=32_768, seq=512, predictions=80, steps=1_561, lr=4e-3, warmup=200,
            remat='dots'),
}


def get_config(arg=None):
  config = large.get_config()
  phase = 1
  if arg and arg.startswith('phase='):
    head, _, arg = arg.partition(',')
    phase = int(head.split('=', 1)[1])
    if phase not in PHASES:
      raise ValueError(f'Config argument phase={phase}: expected one of {sorted(PHASES)}.')
  p = PHASES[phase]
  config.model.update(dtype='bfloat16', remat_policy=p['remat'])
  config.data.update(max_seq_length=p['seq'], max_predictions_per_seq=p['predictions'])
  config.train.update(optimizer='lamb', batch_size=p['batch'], num_steps=p['steps'],
                      learning_rate=p['lr'], warmup_steps=p['warmup'], log_every=10,
                      eval_every=1000, checkpoint_every=500)
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config
