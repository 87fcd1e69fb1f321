"""The GPU's SM clock and power while a block of code runs, read from NVML (the driver's
libnvidia-ml) on a background thread: `with ClockSampler() as clocks: ...; clocks.summary()`.

Why a benchmark wants this: an H200 at BERT-Large seq 512 runs into its 700 W cap, and its SM
clock falls from 1,980 MHz to about 1,700 MHz during the timed steps, while the matmul peak that
MFU divides by is measured in a short burst at full clock (`peak_clocks`: a median of 1,980 MHz on
an H200, docs/performance.md). A faster kernel then draws more power
and lowers the clock under the rest of the step, so step times and the clock must be read side by
side. No NVML (a CPU or TPU machine, no NVIDIA driver) gives no readings and a summary of None;
nothing else here needs a GPU.
"""

import ctypes
import os
import statistics
import threading
from typing import Callable, NamedTuple

# nvmlClocksEventReasons bits (nvml.h): why the clock is below its maximum.
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
THERMAL = 0x20 | 0x40  # Software and hardware thermal slowdown.
_NVML_CLOCK_SM = 1


class Reading(NamedTuple):
  """One device at one instant: SM clock (MHz), power draw (W), clock-event reason bits."""
  sm_mhz: int
  power_w: float
  reasons: int


Reader = Callable[[], list[Reading]]  # One Reading per device sampled.


def _visible_indices(count: int) -> list[int | str]:
  """NVML indices (or GPU-... UUIDs) of the devices this process's CUDA sees."""
  visible = os.environ.get('CUDA_VISIBLE_DEVICES')
  if visible is None:
    return list(range(count))
  return [int(v) if v.strip().isdigit() else v.strip() for v in visible.split(',') if v.strip()]


def nvml_reader() -> Reader | None:
  """A Reader of every device CUDA_VISIBLE_DEVICES names (all when unset), or None when NVML
  cannot be loaded or started (no NVIDIA driver) or names no device."""
  try:
    lib = ctypes.CDLL('libnvidia-ml.so.1')
    if lib.nvmlInit_v2() != 0:
      return None
    count = ctypes.c_uint()
    if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
      return None
    handles = []
    for device in _visible_indices(count.value):
      handle = ctypes.c_void_p()
      found = (lib.nvmlDeviceGetHandleByUUID(device.encode(), ctypes.byref(handle))
               if isinstance(device, str) else
               lib.nvmlDeviceGetHandleByIndex_v2(device, ctypes.byref(handle)))
      if found == 0:
        handles.append(handle)
    # Renamed from ...ClocksThrottleReasons in newer drivers; both names are exported since 535.
    reasons_of = getattr(lib, 'nvmlDeviceGetCurrentClocksEventReasons', None) or getattr(
        lib, 'nvmlDeviceGetCurrentClocksThrottleReasons')
  except (OSError, AttributeError):  # No library, or one without these entry points.
    return None
  if not handles:
    return None

  def read() -> list[Reading]:
    readings = []
    for handle in handles:
      mhz, milliwatts, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
      lib.nvmlDeviceGetClockInfo(handle, _NVML_CLOCK_SM, ctypes.byref(mhz))
      lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(milliwatts))
      reasons_of(handle, ctypes.byref(reasons))
      readings.append(Reading(mhz.value, milliwatts.value / 1000.0, reasons.value))
    return readings

  return read


def summarize(readings: list[Reading]) -> dict | None:
  """The median and lowest SM clock, the median and highest power, and the fraction of readings
  held back by the power cap, a hardware slowdown or heat; None for no readings."""
  if not readings:
    return None
  def share(bits: int) -> float:
    return round(sum(1 for r in readings if r.reasons & bits) / len(readings), 3)

  return {
      'samples': len(readings),
      'sm_mhz_median': statistics.median(r.sm_mhz for r in readings),
      'sm_mhz_min': min(r.sm_mhz for r in readings),
      'power_w_median': round(statistics.median(r.power_w for r in readings), 1),
      'power_w_max': round(max(r.power_w for r in readings), 1),
      'power_capped_fraction': share(SW_POWER_CAP),
      'slowdown_fraction': share(HW_SLOWDOWN | THERMAL),
  }


class ClockSampler:
  """Reads every `interval_s` on a thread from enter to exit (and once at each end);
  `summary()` after exit. `read` defaults to nvml_reader(); without one, nothing is read."""

  def __init__(self, read: Reader | None = None, interval_s: float = 0.01):
    if interval_s <= 0:
      raise ValueError(f'interval_s must be > 0 seconds; got {interval_s}.')
    self._read = read if read is not None else nvml_reader()
    self._interval_s = interval_s
    self._stop = threading.Event()
    self._thread = None
    self.readings: list[Reading] = []

  def _run(self) -> None:
    while True:
      self.readings.extend(self._read())
      if self._stop.wait(self._interval_s):
        self.readings.extend(self._read())
        return

  def __enter__(self) -> 'ClockSampler':
    if self._read is not None:
      self._thread = threading.Thread(target=self._run, name='gpu-clocks', daemon=True)
      self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    if self._thread is not None:
      self._stop.set()
      self._thread.join()

  def summary(self) -> dict | None:
    return summarize(self.readings)
