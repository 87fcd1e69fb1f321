"""The accelerators' published numbers: TPU generations as JAX sees them (bert_jax.aot compiles
for them) and the dense bf16 peaks of TPUs and NVIDIA GPUs (bert_jax.train.metrics reports MFU against
them beside the measured peak)."""

import dataclasses
import glob
import logging
import os


@dataclasses.dataclass(frozen=True)
class TpuSpec:
  """One TPU generation as JAX sees it: a device is a chip, except on v3 (a core)."""
  generation: str  # Topology prefix, e.g. 'v4'.
  device_kind: str  # jax Device.device_kind of its devices.
  hbm_gib: float  # HBM of one device.
  peak_tflops: float  # Dense bf16 peak of one device.
  hbm_gbps: float  # HBM bandwidth of one device, GB/s.
  devices_per_chip: int
  chip_config: str = 'default'  # libtpu chip config: 'megacore' joins a chip's two cores.


TPU_SPECS = {spec.generation: spec for spec in (
    # Per chip: 32 GiB, 123 TFLOP/s, 900 GB/s; JAX sees its two cores as two devices.
    TpuSpec('v3', 'TPU v3', 16, 61.5, 450, devices_per_chip=2),
    TpuSpec('v4', 'TPU v4', 32, 275, 1200, devices_per_chip=1, chip_config='megacore'),
    TpuSpec('v5e', 'TPU v5 lite', 16, 197, 819, devices_per_chip=1),
    TpuSpec('v5p', 'TPU v5', 95, 459, 2765, devices_per_chip=1, chip_config='megacore'),
    TpuSpec('v6e', 'TPU v6 lite', 32, 918, 1640, devices_per_chip=1),
)}

# Dense (no sparsity) bf16 tensor-core peaks of NVIDIA GPUs from NVIDIA's datasheets, FLOP/s per
# device, by a substring of the device's name (jax's device_kind, torch's device name); the first
# match wins, so the variants come before the names they contain.
GPU_DATASHEET_BF16_FLOPS = (
    ('H100 PCIe', 756e12), ('H100 NVL', 835e12), ('H100', 989e12),
    ('H200 NVL', 835e12), ('H200', 989e12),
    ('A100', 312e12),
)


def datasheet_peak_flops(device_kind: str) -> float | None:
  """The vendor's dense bf16 peak of one device of this kind (FLOP/s): NVIDIA's datasheets for
  the GPUs above, TPU_SPECS for TPUs; None for a kind not listed (CPUs too)."""
  for spec in TPU_SPECS.values():
    if device_kind == spec.device_kind:
      return spec.peak_tflops * 1e12
  return next((flops for name, flops in GPU_DATASHEET_BF16_FLOPS if name in device_kind), None)


# Where a TPU VM exposes its chips: /dev/accel* (v2-v4, v5p), /dev/vfio/N (v5e, v6e).
TPU_DEVICE_FILES = ('/dev/accel*', '/dev/vfio/[0-9]*')


def tpu_attached() -> bool:
  """Whether this machine has TPU chips (their device files exist)."""
  return any(glob.glob(pattern) for pattern in TPU_DEVICE_FILES)


def gpu_compute_capability() -> float | None:
  """The compute capability of this machine's first NVIDIA GPU (9.0 on an H100), asked of
  nvidia-smi without starting JAX; None where there is none (or no nvidia-smi to say)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  try:
    result = subprocess.run(['nvidia-smi', '--query-gpu=compute_cap', '--format=csv,noheader'],
                            capture_output=True, text=True, timeout=20, check=False)
  except (OSError, subprocess.SubprocessError):
    return None
  lines = result.stdout.split()
  try:
    return float(lines[0]) if result.returncode == 0 and lines else None
  except ValueError:
    return None


def kernels_here() -> str:
  """Which kernels this machine takes, found without starting JAX: 'tpu' where TPU chips are
  attached, 'hopper' on an NVIDIA Hopper GPU (compute capability 9.x: the Triton and Mosaic GPU
  kernels), else 'xla' (CPUs, older GPUs)."""
  if tpu_attached():
    return 'tpu'
  capability = gpu_compute_capability()
  return 'hopper' if capability is not None and 9 <= capability < 10 else 'xla'


def quiet_absent_tpu(compile_only: bool = False) -> None:
  """Keeps libtpu from printing errors about a TPU this machine does not have.

  Call at the start of a command, before JAX starts its backends. With libtpu installed
  (requirements-dev.txt and -tpu.txt install it) JAX loads it on every machine, and without a
  TPU libtpu prints errors about the accelerator type, worker hostnames and host bounds it
  cannot find. Where a TPU is attached, or JAX_PLATFORMS names 'tpu', nothing changes. Otherwise
  libtpu is not loaded (TPU_LOAD_LIBRARY=0, its own switch; JAX picks CPU or GPU as it would
  anyway), or, with `compile_only` (bert_jax.aot compiles for TPU topologies through libtpu),
  libtpu is told it runs on one local host, which it would otherwise look up; the topologies it
  describes are the same. TPU_* variables already set are kept.
  """
  if tpu_attached() or 'tpu' in os.environ.get('JAX_PLATFORMS', ''):
    return
  if compile_only:
    os.environ.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')
    os.environ.setdefault('TPU_HOST_BOUNDS', '1,1,1')
  else:
    os.environ.setdefault('TPU_LOAD_LIBRARY', '0')
  # JAX's INFO line about the TPU backend it could not start says nothing new here.
  logging.getLogger('jax._src.xla_bridge').addFilter(
      lambda record: not (record.levelno <= logging.INFO and
                          "backend 'tpu'" in record.getMessage()))
