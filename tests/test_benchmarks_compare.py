"""benchmarks/compare.py: its table and its refusal of bad input before anything runs."""

import pytest

from benchmarks import compare


def test_no_mfu_is_shown_against_a_peak_above_the_datasheet():
  record = {'mfu': 40.9, 'peak_flops_per_device': 10.9e15, 'peak_above_datasheet': True}
  assert compare.mfu_cell(record).startswith('not a real figure: peak measured 10900')
  assert compare.mfu_cell({'mfu': 0.615, 'peak_above_datasheet': False}) == '61.5%'
  assert compare.percent(None) == ''


def test_seq_per_s_shows_the_spread_of_the_repeats():
  assert compare.seq_per_s_cell({'seq_per_s': 438.0, 'seq_per_s_all': [406.0, None, 438.0]}) == (
      '438 (406-438 in 2)')
  assert compare.seq_per_s_cell({'seq_per_s': 2029.4}) == '2029'


def test_the_table_puts_ours_over_the_peer_compile_of_its_shape():
  peer = {'seq_per_s': 300.0, 'mfu': 0.4, 'peak_memory_bytes': 2**31}
  ours = {'seq_per_s': 450.0, 'mfu': 0.56, 'peak_memory_bytes': 2**32, 'mfu_vs_datasheet': 0.46,
          'clocks': {'sm_mhz_median': 1700, 'power_w_median': 690},
          'peak_clocks': {'sm_mhz_median': 1980}}
  lines = compare.table([('large:512:32', {'peer-compile': peer, 'large_gpu': ours,
                                           'cudnn': {'error': 'out of memory'}})]).splitlines()
  assert lines[3] == ('| large:512:32 | large_gpu | 450 | 56.0% | 46.0% | 4.0 | 1.50x | '
                      '1700 (1980) | 690 |')
  assert lines[4].startswith('| large:512:32 | cudnn | error: out of memory |')


@pytest.mark.parametrize('argv, message', [
    (['--shapes=huge:128:8'], "--shapes entry 'huge:128:8'"),
    (['--variants=fast'], "unknown variant 'fast'"),
    (['--peer=jit'], "peer mode 'jit'"),
    (['--repeats=0'], '--repeats=0'),
])
def test_bad_input_is_refused_before_anything_runs(argv, message, capsys, monkeypatch):
  monkeypatch.setattr(compare.harness, 'run_process', lambda *_: pytest.fail('ran'))
  with pytest.raises(SystemExit):
    compare.main(argv)
  assert message in capsys.readouterr().err


def test_family_shapes_run_ours_and_the_peer_only_for_bert(monkeypatch, tmp_path, capsys):
  ran = []

  def fake_process(command):
    ran.append(command)
    return {'seq_per_s': 100.0 + len(ran), 'mfu': 0.5, 'peak_memory_bytes': 2**30}
  monkeypatch.setattr(compare.harness, 'run_process', fake_process)
  compare.main(['--shapes=base:128:256,roberta-base:128:256,albert-base:128:256',
                '--peer=compile', '--variants=paper', f'--out={tmp_path / "out.jsonl"}'])
  peers = [c for c in ran if any(part.endswith('peer.py') for part in c)]
  assert len(peers) == 1 and '--model=base' in peers[0]
  configs = [part for c in ran for part in c if part.startswith('--config=')]
  assert configs == ['--config=configs/base.py', '--config=configs/roberta.py:size=base',
                     '--config=configs/albert.py:size=base']
  table = capsys.readouterr().out
  assert '| roberta-base:128:256 | paper | 103 |' in table
  assert '| albert-base:128:256 | paper | 104 |' in table
