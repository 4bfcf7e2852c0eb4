"""Throughput and model FLOPs utilisation (MFU) of a training run, against the device's peak.

    meter = meter_for(config, hf_config, hardware, devices=2, drives_tpu=False,
                      cpu_peak=trainer.cpu_peak_flops)   # the engine probes the CPU now
    meter.fields(steps_per_s)    # {"tokens_per_s_per_device", "model_flops_per_s", "mfu"}
    meter.words(fields)          # "tokens/s/chip 41,000  MFU 38.5%"
    meter.scalars(fields)        # TensorBoard tags and values
    meter.header()               # what the figures are measured against, for metrics.json

Model FLOPs per step are payload.training.runplan's estimate for the model the stage built. The peak is
the accelerator table's bf16 figure per chip when the engine drives a TPU, and otherwise a
float32 matrix-multiply probe run in this process at start, in the engine's own framework
(Trainer.cpu_peak_flops, timed by `best_rate`): so a CPU run gets a real ratio too, against what
this machine's cores did a moment before (processes sharing a machine share its cores, and each
probe sees that).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

PROBE_SIZE = 1024  # square float32 matrices: large enough for the BLAS to reach its rate
PROBE_ROUNDS = 5
PROBE_PRODUCTS = 8  # per round


@dataclass(frozen=True, kw_only=True)
class Meter:
    flops_per_step: float  # model FLOPs of one global step
    tokens_per_step: int
    devices: int  # TPU chips, or CPU training processes
    device: str  # "chip" or "process"
    peak_flops_per_device: float
    peak_source: str

    def fields(self, steps_per_s: float) -> dict:
        flops = self.flops_per_step * steps_per_s
        return {
            "tokens_per_s_per_device": self.tokens_per_step * steps_per_s / self.devices,
            "model_flops_per_s": flops,
            "mfu": flops / (self.peak_flops_per_device * self.devices),
        }

    def words(self, fields: dict) -> str:
        mfu = fields["mfu"]
        shown = f"{mfu:.1%}" if mfu >= 0.01 else f"{mfu * 100:.2g}%"  # tiny models: 0.012%
        return f"tokens/s/{self.device} {fields['tokens_per_s_per_device']:,.0f}  MFU {shown}"

    def scalars(self, fields: dict) -> dict:
        return {f"train/tokens_per_s_per_{self.device}": fields["tokens_per_s_per_device"],
                "train/model_flops_per_s": fields["model_flops_per_s"],
                "train/mfu": fields["mfu"]}

    def header(self) -> dict:
        return {"device": self.device, "devices": self.devices,
                "peak_flops_per_device": self.peak_flops_per_device,
                "peak_source": self.peak_source, "flops_per_step": self.flops_per_step,
                "tokens_per_step": self.tokens_per_step}


def best_rate(run: Callable[[int], None], *, size: int = PROBE_SIZE, rounds: int = PROBE_ROUNDS,
              products: int = PROBE_PRODUCTS) -> float:
    """FLOP/s of `run(count)`, which multiplies two size x size float32 matrices `count` times
    and waits for the result: the best of a few timed rounds after one to warm up (the machine
    may be busy with something else for one of them)."""
    run(1)  # trace, compile and warm up: threads, page faults
    best = 0.0
    for _ in range(rounds):
        began = time.perf_counter()
        run(products)
        best = max(best, 2 * size**3 * products / (time.perf_counter() - began))
    return best


def matmul_probe_flops(size: int = PROBE_SIZE, rounds: int = PROBE_ROUNDS,
                       products: int = 2) -> float:
    """The engines' CPU probe without a framework (numpy's BLAS, a fraction of a second): what a
    run plan can afford to measure. Same shape of work, and the same best-of-rounds."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = (rng.random((size, size), dtype=np.float32) for _ in range(2))

    def run(count: int) -> None:
        for _ in range(count):
            a @ b

    return best_rate(run, size=size, rounds=rounds, products=products)


def meter_for(config, hf_config, hardware, *, devices: int, drives_tpu: bool,
              cpu_peak: Callable[[], float]) -> Meter:
    """The meter for a training run: FLOPs from the built model's config, the peak from the
    accelerator table when the engine drives a TPU (`devices` is then ignored: the slice's
    chips count), else from the engine's CPU probe `cpu_peak` (run now) per training process
    (`devices` of them)."""
    from payload.training.runplan import row_flops
    from payload.training.strategy import tpu_topology

    batch = config.train.batch_size
    architecture = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
    flops = row_flops(config, architecture).total * batch
    tokens = batch * config.data.seq_len
    acc = tpu_topology(hardware)
    if acc is not None and drives_tpu:
        return Meter(flops_per_step=flops, tokens_per_step=tokens, devices=acc.chips,
                     device="chip", peak_flops_per_device=acc.peak_bf16_flops_per_chip,
                     peak_source=(f"accelerator table: TPU {acc.generation} "
                                  f"{acc.peak_bf16_flops_per_chip / 1e12:,.0f} TFLOP/s bf16 per "
                                  "chip"))
    peak = cpu_peak()
    return Meter(flops_per_step=flops, tokens_per_step=tokens,
                 devices=devices, device="process",
                 peak_flops_per_device=peak,
                 peak_source=(f"CPU probe: float32 {PROBE_SIZE}x{PROBE_SIZE} matrix products "
                              f"at start, {peak / 1e9:,.1f} GFLOP/s in this process"))
