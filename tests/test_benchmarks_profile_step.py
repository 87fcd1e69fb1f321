"""benchmarks/profile_step.py's idle accounting: where a step's GPU runs no kernel."""

from benchmarks import profile_step


def test_idle_gaps_merge_overlapping_kernels_and_sum_gaps_by_neighbours():
  ms = 1_000_000  # ns
  events = [  # (start, end, label) over two steps, two streams overlapping in the first.
      (0, 4 * ms, 'a'), (2 * ms, 5 * ms, 'b'),  # busy 0-5: b ends it
      (6 * ms, 7 * ms, 'c'),                    # gap b -> c: 1 ms
      (7 * ms, 9 * ms, 'a'),                    # touching: no gap
      (12 * ms, 13 * ms, 'c'),                  # gap a -> c: 3 ms
      (14 * ms, 16 * ms, 'a'),                  # gap c -> a: 1 ms
  ]
  idle = profile_step.idle_gaps(reversed(events), steps=2)  # Any order in.
  assert idle['span_ms'] == 8.0 and idle['busy_ms'] == 5.5 and idle['idle_ms'] == 2.5
  assert [(g['after'], g['before'], g['ms'], g['count']) for g in idle['gaps']] == [
      ('a', 'c', 1.5, 0.5), ('b', 'c', 0.5, 0.5), ('c', 'a', 0.5, 0.5)]


def test_idle_gaps_of_no_kernels_is_zero():
  assert profile_step.idle_gaps([], steps=3)['idle_ms'] == 0.0
