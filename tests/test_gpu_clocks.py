"""bert_jax.tools.gpu_clocks: NVML's SM clock and power, sampled while a block runs."""

import threading

import pytest

from bert_jax.tools import gpu_clocks
from bert_jax.tools.gpu_clocks import Reading


def test_summary_gives_medians_and_the_share_held_back_by_the_power_cap():
  readings = [Reading(1980, 400.0, 0), Reading(1700, 690.0, gpu_clocks.SW_POWER_CAP),
              Reading(1650, 700.5, gpu_clocks.SW_POWER_CAP | 0x1),
              Reading(1500, 650.0, 0x20)]  # Software thermal slowdown.
  summary = gpu_clocks.summarize(readings)
  assert summary == {'samples': 4, 'sm_mhz_median': 1675.0, 'sm_mhz_min': 1500,
                     'power_w_median': 670.0, 'power_w_max': 700.5,
                     'power_capped_fraction': 0.5, 'slowdown_fraction': 0.25}
  assert gpu_clocks.summarize([]) is None


def test_sampler_reads_while_the_block_runs_and_stops_after_it():
  calls = []
  three_reads = threading.Event()

  def read():
    calls.append(1)
    if len(calls) >= 3:
      three_reads.set()
    return [Reading(1800, 500.0, 0), Reading(1700, 510.0, 0)]  # Two devices.

  with gpu_clocks.ClockSampler(read, interval_s=0.001) as sampler:
    assert three_reads.wait(timeout=30), 'the sampler never read three times'
  reads_at_exit = len(calls)
  three_reads.clear()
  assert not three_reads.wait(timeout=0.05)  # Nothing reads once the block has ended.
  assert len(calls) == reads_at_exit and len(sampler.readings) == 2 * reads_at_exit
  assert sampler.summary()['sm_mhz_min'] == 1700


def test_without_nvml_nothing_is_read(monkeypatch):
  def no_library(name):
    raise OSError(f'{name}: cannot open shared object file')

  monkeypatch.setattr(gpu_clocks.ctypes, 'CDLL', no_library)
  assert gpu_clocks.nvml_reader() is None
  with gpu_clocks.ClockSampler() as sampler:
    pass
  assert sampler.readings == [] and sampler.summary() is None


def test_bad_interval_is_named():
  with pytest.raises(ValueError, match=r'interval_s must be > 0 seconds; got 0'):
    gpu_clocks.ClockSampler(lambda: [], interval_s=0)


class _FakeNvml:
  """libnvidia-ml's entry points that nvml_reader calls, over four devices. Each device i runs
  at 1000 + i MHz, draws (100 + i) W, and device 2 is at the power cap."""

  def __init__(self, new_reasons_name: bool):
    self.uuids = {b'GPU-aaaa': 3}
    if new_reasons_name:
      self.nvmlDeviceGetCurrentClocksEventReasons = self._reasons

  @staticmethod
  def _set(pointer, value):
    pointer._obj.value = value  # pylint: disable=protected-access
    return 0

  def nvmlInit_v2(self):
    return 0

  def nvmlDeviceGetCount_v2(self, count):
    return self._set(count, 4)

  def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
    return self._set(handle, 100 + index) if index < 4 else 2  # NVML_ERROR_INVALID_ARGUMENT.

  def nvmlDeviceGetHandleByUUID(self, uuid, handle):
    return self._set(handle, 100 + self.uuids[uuid]) if uuid in self.uuids else 13

  def nvmlDeviceGetClockInfo(self, handle, clock_type, mhz):
    assert clock_type == 1  # NVML_CLOCK_SM.
    return self._set(mhz, 1000 + handle.value - 100)

  def nvmlDeviceGetPowerUsage(self, handle, milliwatts):
    return self._set(milliwatts, 1000 * (100 + handle.value - 100))

  def _reasons(self, handle, reasons):
    return self._set(reasons, gpu_clocks.SW_POWER_CAP if handle.value == 102 else 0)

  nvmlDeviceGetCurrentClocksThrottleReasons = _reasons  # The older drivers' name.


@pytest.mark.parametrize('new_reasons_name', [True, False])
@pytest.mark.parametrize('visible, expected', [
    (None, [0, 1, 2, 3]),  # CUDA_VISIBLE_DEVICES unset: every device.
    ('2', [2]),
    ('1,GPU-aaaa', [1, 3]),
    ('3,7', [3]),  # A device NVML does not have is left out.
])
def test_nvml_reader_reads_the_devices_cuda_sees(monkeypatch, visible, expected,
                                                  new_reasons_name):
  fake = _FakeNvml(new_reasons_name)
  monkeypatch.setattr(gpu_clocks.ctypes, 'CDLL', lambda name: fake)
  if visible is None:
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
  else:
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', visible)
  read = gpu_clocks.nvml_reader()
  assert read() == [Reading(1000 + i, 100.0 + i, gpu_clocks.SW_POWER_CAP if i == 2 else 0)
                    for i in expected]


def test_nvml_reader_is_none_when_nvml_does_not_start(monkeypatch):
  fake = _FakeNvml(True)
  fake.nvmlInit_v2 = lambda: 9  # NVML_ERROR_DRIVER_NOT_LOADED.
  monkeypatch.setattr(gpu_clocks.ctypes, 'CDLL', lambda name: fake)
  assert gpu_clocks.nvml_reader() is None


def test_nvml_reader_is_none_without_a_clock_reasons_entry_point(monkeypatch):
  class Ancient(_FakeNvml):
    nvmlDeviceGetCurrentClocksThrottleReasons = property()  # Reading it raises AttributeError.

  monkeypatch.setattr(gpu_clocks.ctypes, 'CDLL', lambda name: Ancient(False))
  monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
  assert gpu_clocks.nvml_reader() is None
