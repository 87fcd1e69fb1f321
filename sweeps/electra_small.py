"""ELECTRA-Small against BERT-Small at equal compute (Clark et al. 2020, Table 1).

Both arms are the paper's small shape: 12 layers, 256 wide, 4 heads, feed-forward 1,024,
128-wide embeddings projected to 256 (ElectraModel), seq 128, batch 128, Adam eps 1e-6 and
learning rate 5e-4, the bert-base-uncased vocab on configs/small.py's corpus and Hopper kernels.

  ELECTRA     replaced-token detection: a generator a quarter as wide (64, one head) fills the
              masked positions ([MASK] 85%, kept 15%) with samples; loss MLM + 50 x RTD.
  BERT-Small  the same encoder trained by MLM alone (BERT's 80/10/10 masking), for the steps at
              which its training FLOPs match ELECTRA's (`sweep.equal_flops`), as the paper's
              BERT-Small is.

The report gives each arm's held-out losses, ELECTRA's RTD AUC, and SST-2 dev after fine-tuning
both arms by ELECTRA's small-model recipe (layer-wise decay 0.8, no weight decay) at the best
on dev of learning rates 1e-4, 2e-4 and 3e-4 (the paper's Table 7: 3e-4). The 30,000 steps
and the fine-tuning at one rate took about 20 minutes on one H200 (docs/family.md has that
measured run; the grid fine-tunes three times as many runs); `--sweep.steps=10000` is a
quicker look at a discriminator that has not yet learned much.

  python -m bert_jax.sweep run --sweep=sweeps/electra_small.py --workdir=runs/electra_small
"""

from sweeps import common

# configs/electra.py's small row on configs/small.py's data and kernels.
SMALL = 'layers=12,hidden=256,heads=4,batch=128'
SMALL_MODEL = {'name': 'electra', 'embedding_size': 128, 'intermediate_size': 1024}
# checkpoint_every: a run cut short resumes from its last 2,000-step checkpoint.
SMALL_TRAIN = {'learning_rate': 5e-4, 'adam_eps': 1e-6, 'checkpoint_every': 2000}
STEPS = 30_000


def get_config():
  sweep = common.sweep(
      'electra_small', 'ELECTRA-Small and BERT-Small at equal compute',
      'The paper\'s small shape (12 layers, 256 wide, 128-wide embeddings, batch 128) trained '
      'by replaced-token detection and by MLM alone for the same training FLOPs; each is '
      'fine-tuned with the same settings and seeds.')
  sweep.steps = STEPS
  common.with_arms(sweep, {
      'electra': {
          'label': 'ELECTRA-Small (RTD, generator 1/4 wide)', 'args': SMALL,
          'pretrain': {'objectives': 'rtd',
                       'model': {**SMALL_MODEL, 'generator_fraction': 0.25,
                                 'disc_weight': 50.0},
                       'masking': {'mask_token_fraction': 0.85, 'random_token_fraction': 0.0,
                                   'keep_fraction': 0.15},
                       'train': SMALL_TRAIN}},
      'bert_small': {
          'label': 'BERT-Small (MLM only)', 'args': SMALL,
          'pretrain': {'objectives': 'mlm', 'model': SMALL_MODEL, 'train': SMALL_TRAIN}},
  })
  sweep.equal_flops = 'electra'
  sweep.finetune.tasks = 'sst2'
  # ELECTRA's fine-tuning recipe for its small models (the paper's Table 7: learning rate 3e-4,
  # layer-wise decay 0.8, no weight decay); both arms alike. BERT's grid (5e-5 to 2e-5) is far
  # below that rate, so the grid is ELECTRA's own: its Table 7 value and two below it (BERT's
  # grid also ends at the rate its recipe gives), each arm's best on dev reported.
  sweep.finetune.learning_rates = '1e-4,2e-4,3e-4'
  sweep.finetune.overrides['train'].update(learning_rate=3e-4, layerwise_lr_decay=0.8,
                                           weight_decay=0.0)
  return sweep
