"""ELECTRA's generator size (Clark et al. 2020, Figure 3): the discriminator is fixed and the
generator's width is 1/6, 1/4, 1/3 or 1/2 of it, beside BERT's MLM alone.

Every arm is configs/small.py's shape (6 layers, 768 wide, seq 128, batch 256) on the same
documents and WordPiece vocab, for the same steps (the paper trains every generator size for
the same steps; the report's budget column gives each arm's FLOPs). The ELECTRA arms are the
family sweep's ELECTRA (loss MLM + 50 x RTD, masked positions [MASK] 85% and kept 15%, Adam eps
1e-6) with the generator's width changed (heads: one per 64 units); the paper finds 1/4 to 1/2
best, and a generator as wide as the discriminator worse. The report's RTD AUC and accuracy say
how well each discriminator detects its generator's samples.

  python -m bert_jax.sweep run --sweep=sweeps/electra_generator.py --workdir=runs/electra_generator
"""

from sweeps import common
from sweeps import family

FRACTIONS = {'1_6': 1 / 6, '1_4': 1 / 4, '1_3': 1 / 3, '1_2': 1 / 2}


def electra(fraction: float) -> dict:
  """family.ELECTRA with the generator `fraction` of the discriminator's width."""
  return {**family.ELECTRA, 'model': {**family.ELECTRA['model'], 'generator_fraction': fraction}}


def get_config():
  sweep = common.sweep(
      'electra_generator', "ELECTRA's generator size",
      'One discriminator (6 layers, 768 wide) trained by replaced-token detection against '
      'generators of four widths for the same steps, and BERT\'s MLM alone beside them; each is '
      'fine-tuned with the same settings and seeds.')
  common.with_arms(sweep, {
      **{f'generator_{name}': {'label': f'ELECTRA, generator {name.replace("_", "/")} wide',
                               'pretrain': electra(fraction)}
         for name, fraction in FRACTIONS.items()},
      'bert_mlm': {'label': 'BERT (MLM only)', 'args': 'nsp=False'},
  })
  return sweep
