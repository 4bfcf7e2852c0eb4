"""The JAX half of the accelerator bench: the engine's own training step, in a process of its own
(so its start-up, compile and cache use are what a run's are). Imports no TensorFlow.

    python -m bench.accel_jax step CASE.json      # one JSON line: init, compile, first step, rate
    python -m bench.accel_jax matmul SIZE DTYPE   # one JSON line: the measured FLOP/s of a product

CASE.json (written by bench.accel_bench): the transformers config, batch, lengths, steps, bf16,
and the compilation cache folder. Time to the first step counts from this process's start:
imports, drawing the weights, compiling (or loading from the cache) and the step itself.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import json  # noqa: E402
import sys  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402


def random_batch(case: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random tokens in the batch layout the engine's objectives give (all rows full)."""
    batch, length, vocab = case["batch"], case["seq_len"], case["architecture"]["vocab_size"]
    ids = rng.integers(5, vocab, (batch, length)).astype(np.int32)
    rows = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if case["family"] in ("bert", "roberta"):
        k = case["predicted"]
        positions = np.sort(np.stack([rng.choice(length, k, replace=False)
                                      for _ in range(batch)]), axis=1).astype(np.int32)
        return rows | {"masked_positions": positions,
                       "masked_ids": rng.integers(5, vocab, (batch, k)).astype(np.int32),
                       "masked_weights": np.ones((batch, k), np.float32)}
    return rows | {"labels": ids}


def step(case: dict) -> dict:
    import jax

    from payload.core.fit.attention import generation_of
    from payload.core.fit.sharding import plan_sharding
    from payload.core.fit.sites import attention_plan
    from payload.core.fit.workload import Workload
    from payload.engines.jax import step as jax_step
    from payload.engines.jax.cache import compile_ahead, use_compilation_cache
    from payload.engines.jax.models import parameter_shapes

    imported = time.perf_counter()
    use_compilation_cache(case["cache_dir"])
    arch = case["architecture"]
    # train's settings as payload.config.TrainConfig has them (no pydantic needed here).
    train = SimpleNamespace(steps=10_000, batch_size=case["batch"], learning_rate=1e-4,
                            warmup_steps=100, weight_decay=0.01, max_grad_norm=1.0,
                            optimizer="adamw", bf16=case["bf16"], seed=0,
                            remat=case.get("remat", "auto"))
    device = jax.devices()[0]
    workload = Workload(architecture=arch, batch_size=case["batch"], seq_len=case["seq_len"],
                        target_len=None, predicted_len=case["predicted"], bf16=case["bf16"],
                        remat=train.remat, platform=jax.default_backend(),
                        generation=generation_of(device.device_kind))
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    hbm = int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else 64 << 30
    num_params = sum(int(np.prod(s.shape)) for s in parameter_shapes(arch).values())
    plan = plan_sharding(num_params, num_devices=jax.device_count(),
                                  hbm_bytes_per_chip=hbm, workload=workload)
    program = jax_step.TrainProgram(arch, family=case["family"], train_cfg=train,
                                    mesh=jax_step.make_mesh(plan), remat=plan.remat)
    began = time.perf_counter()
    state = program.init_state(seed=0)
    jax.block_until_ready(state)
    init_s = time.perf_counter() - began
    batch = program.global_batch(random_batch(case, np.random.default_rng(0)))
    compiled, report = compile_ahead(program.train_step, state, batch)
    began = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    first_step_s = time.perf_counter() - began
    first_step_since_start_s = time.perf_counter() - STARTED
    for _ in range(case["warmup"]):
        state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    began = time.perf_counter()
    for _ in range(case["steps"]):
        state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    elapsed = time.perf_counter() - began
    return {
        "side": "jax", "platform": jax.default_backend(), "device": device.device_kind,
        "versions": {"jax": jax.__version__, **_versions("flax", "optax")},
        "import_s": imported - STARTED, "init_s": init_s, "compile_s": report["compile_s"],
        "cache": report["cache"], "first_step_s": first_step_s,
        "first_step_since_start_s": first_step_since_start_s,
        "steps_per_s": case["steps"] / elapsed, "loss": float(metrics["loss"]),
        "remat": plan.remat,
        "attention": attention_plan(arch, platform=workload.platform,
                                    generation=workload.generation, seq_len=case["seq_len"],
                                    bf16=case["bf16"]),
    }


def matmul(size: int, dtype: str) -> dict:
    """FLOP/s of a square matrix product on the default device (best of a few)."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((size, size), dtype)
    product = jax.jit(lambda x: x @ x)
    product(a).block_until_ready()
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(5):
            out = product(a)
        out.block_until_ready()
        best = min(best, (time.perf_counter() - began) / 5)
    return {"flops_per_s": 2 * size**3 / best, "size": size, "dtype": dtype,
            "device": jax.devices()[0].device_kind, "platform": jax.default_backend()}


def _versions(*names: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "step":
        with open(sys.argv[2], encoding="utf-8") as f:
            out = step(json.load(f))
    elif what == "matmul":
        out = matmul(int(sys.argv[2]), sys.argv[3])
    else:
        raise SystemExit(f"unknown measurement {what}")
    print(json.dumps(out))
