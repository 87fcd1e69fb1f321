"""The accelerators' published numbers: TPU generations as JAX sees them (bert_jax.aot compiles
for them) and the dense bf16 peaks of TPUs and NVIDIA GPUs (bert_jax.train.metrics reports MFU against
them beside the measured peak)."""

import dataclasses


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
