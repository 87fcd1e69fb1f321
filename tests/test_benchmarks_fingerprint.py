"""benchmarks/fingerprint.py: the lowered train step's digest is the same for the same config
and changes with what the step computes, for every family's small config."""

import hashlib

from benchmarks import fingerprint


def digest(config) -> str:
  return hashlib.sha256(fingerprint.lowered_text(config).encode()).hexdigest()


def test_the_digest_repeats_and_sees_a_change_in_the_step():
  first = digest(fingerprint.family_config('bert'))
  assert digest(fingerprint.family_config('bert')) == first
  changed = fingerprint.family_config('bert')
  changed.model.hidden_dropout_rate = 0.2
  assert digest(changed) != first


def test_the_text_carries_no_source_locations():
  text = fingerprint.lowered_text(fingerprint.family_config('bert'))
  assert 'loc(' not in text and '.py' not in text


def test_every_family_config_is_small():
  for name in fingerprint.FAMILIES:
    config = fingerprint.family_config(name)
    assert config.model.num_layers == 2 and config.model.hidden_size == 64, name
    assert config.train.grad_accum_steps <= 2, name


def test_every_shipped_config_has_a_digest_of_its_keys_and_values():
  lines = fingerprint.config_digests()
  files = [line.split()[1] for line in lines]
  assert 'configs/base.py' in files and 'configs/deberta.py' in files and 'configs/tiny.py' in files
  assert all(len(line.split()[2]) == 64 for line in lines)
  assert len(set(line.split()[2] for line in lines)) == len(lines)  # No two configs alike.
