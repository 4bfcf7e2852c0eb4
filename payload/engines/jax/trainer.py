"""The JAX engine's trainer: the project's Flax models, jitted steps over a device mesh, Orbax.

    trainer = JaxTrainer(config, inputs, plan)   # payload.training.trainer.Trainer
    step = trainer.start(resume=False); trainer.open_train(step)
    loss_sum, first_bad = trainer.train_chunk(10)

Every host runs this as one process of one program (payload.engines.jax.distributed.join when
there are several). Each host reads its rows of every global batch through the neutral reader
(payload.data.stream: the same order, masks and exact resume as the TF engine; host = process
index) as numpy, and they enter the step as part of the global batch
(TrainProgram.global_batch). TensorFlow, where installed, writes TensorBoard's events only: it is
kept off the accelerators. Checkpoints are Orbax step folders directly in
output_dir/checkpoints/ (payload.engines.jax.checkpoints), written by every process.
"""

from __future__ import annotations

import os
import time

import numpy as np

from payload.core import layout, storage
from payload.core.engines import JAX, engine_spec
from payload.core.errors import UserError
from payload.training.inputs import check_batch_size
from payload.training.utilisation import PROBE_PRODUCTS, PROBE_ROUNDS, PROBE_SIZE, best_rate
from payload.training.voice import log


class JaxTrainer:
    def __init__(self, config, inputs, plan):
        from payload.engines.jax.distributed import join

        join(coordinator=plan.coordinator, num_processes=plan.num_processes,
             process_id=plan.process_id, peers=plan.coordinator_peers,
             bind=plan.coordinator_bind)
        import jax

        from payload.core.fit.attention import generation_of
        from payload.core.fit.sharding import plan_sharding
        from payload.core.fit.workload import Workload
        from payload.engines.jax import step as jax_step
        from payload.engines.jax.cache import cache_folder, use_compilation_cache

        # Before anything compiles: a resumed or preempted run loads its step from here.
        use_compilation_cache(cache_folder(config.output_dir))
        from payload.engines.jax.models import parameter_shapes

        self.config, self.inputs, self.plan = config, inputs, plan
        self.family = config.model.family
        num_devices = jax.device_count()
        check_batch_size(config.train.batch_size, num_devices)
        self.process, self.processes = jax.process_index(), jax.process_count()
        architecture = inputs.hf_config.to_dict()
        num_params = sum(int(np.prod(s.shape)) for s in parameter_shapes(architecture).values())
        workload = Workload.of(architecture, model=config.model, data=config.data,
                               train=config.train, platform=jax.default_backend(),
                               generation=generation_of(jax.devices()[0].device_kind))
        sharding = plan_sharding(num_params, num_devices=num_devices,
                                          hbm_bytes_per_chip=_memory_per_device(),
                                          optimizer=config.train.optimizer, workload=workload,
                                          num_slices=plan.num_slices)
        self.program = jax_step.TrainProgram(architecture, family=self.family,
                                             train_cfg=config.train,
                                             mesh=jax_step.make_mesh(sharding),
                                             remat=sharding.remat)
        self.sharding = sharding
        self.replicas = num_devices
        self.drives_tpu = jax.default_backend() == "tpu"
        self.devices = num_devices if self.drives_tpu else self.processes
        self.ckpts = None
        self.state = None
        self.init_source = None
        self.iterator = None
        self.input_wait_s = 0.0  # the training steps' waits for their batches (the goodput's)
        self._step = self.program.train_step  # compile_step puts the compiled one here
        self._first_batch = None  # the batch compile_step compiled for, trained on first
        self._eval_batches: list | None = None
        log(f"JAX on {num_devices} {jax.default_backend()} device(s) in {self.processes} "
            f"process(es): {sharding.kind}, train.remat {sharding.remat}")
        for line in engine_spec(JAX).plan_lines(workload):
            log(line)

    @property
    def latest(self) -> str | None:
        step = self.ckpts.latest if self.ckpts else None
        return None if step is None else storage.join(self.ckpts.directory, str(step))

    def start(self, *, resume: bool) -> int:
        from payload.engines.jax.checkpoints import Checkpoints

        config = self.config
        # A fresh run's chief has just cleared the folder: nobody looks before it is done.
        self._barrier("tpuctl-train-start")
        self.ckpts = Checkpoints(layout.checkpoints_dir(config.output_dir),
                                 keep=config.train.keep_checkpoints)
        if resume:
            self.state = self.ckpts.restore_latest(self.program.abstract_state())
        elif config.model.init_from:
            self.state = self._pretrained(config.model.init_from)
        else:
            # The same initial weights on every start: a run restarted from scratch (after a
            # crash before its first checkpoint) ends where an uninterrupted one does.
            self.state = self.program.init_state(seed=config.train.seed)
        return int(self.state.step)

    def _pretrained(self, folder: str):
        """model.init_from's weights (PyTorch names) in a fresh train state."""
        try:
            from payload.engines.jax.pretrained import read_pretrained
        except ImportError:
            raise UserError("model.init_from: this build's JAX engine cannot read a model "
                            "folder yet",
                            hint="train this run with train.engine: tensorflow") from None
        from flax import nnx

        from payload.engines.jax.models import build_model, load_state_dict

        tensors = read_pretrained(folder, self.inputs.hf_config)
        model = build_model(self.inputs.hf_config.to_dict(), seed=self.config.train.seed,
                            dtype=self.program.dtype)
        load_state_dict(model, tensors)
        self.init_source = folder
        return self.program.state_from_params(nnx.state(model))

    # --- data --------------------------------------------------------------------------

    def open_train(self, start_batch: int) -> None:
        """This host's rows of each global batch from `start_batch` on, as numpy."""
        self.iterator = self.inputs.train_batches(start_batch, host=self.process,
                                                  num_hosts=self.processes,
                                                  digest=self.plan.is_chief)

    # --- steps -------------------------------------------------------------------------

    def compile_step(self) -> dict:
        """Compile the training step for the first batch before training on it, through the
        persistent compilation cache: {"compile_s", "cache": hit | miss | off}."""
        from payload.engines.jax.cache import compile_ahead

        self._first_batch = self.program.global_batch(next(self.iterator))
        self._step, report = compile_ahead(self.program.train_step, self.state,
                                           self._first_batch)
        # The first step's collectives start together, however long each process compiled.
        self._barrier("tpuctl-step-compiled")
        return report

    def _next_batch(self):
        batch, self._first_batch = self._first_batch, None
        if batch is not None:
            return batch
        began = time.perf_counter()  # the host waits for its batch: the device may starve
        batch = self.program.global_batch(next(self.iterator))
        self.input_wait_s += time.perf_counter() - began
        return batch

    def train_chunk(self, num_steps: int) -> tuple[float, int]:
        import jax

        losses = []
        for _ in range(num_steps):  # dispatched asynchronously: the host reads ahead
            self.state, metrics = self._step(self.state, self._next_batch())
            losses.append(metrics["loss"])
        losses = np.asarray(jax.device_get(losses), dtype=np.float64)
        finite = np.isfinite(losses)
        first_bad = -1 if finite.all() else int(np.argmin(finite))
        return float(losses[finite].sum()), first_bad

    def evaluate(self, num_batches: int) -> tuple[float, float, float]:
        if self._eval_batches is None or len(self._eval_batches) < num_batches:
            batches = self.inputs.eval_batches(host=self.process, num_hosts=self.processes)
            self._eval_batches = [next(batches) for _ in range(num_batches)]
        sums = np.zeros(3, np.float64)
        for local in self._eval_batches[:num_batches]:
            sums += np.asarray(self.program.eval_step(self.state.params,
                                                      self.program.global_batch(local)))
        xent, count, correct = (float(x) for x in sums)
        return xent, count, correct

    # --- the rest ----------------------------------------------------------------------

    def save(self, step: int) -> None:
        storage.note_change("checkpoint", storage.join(self.ckpts.directory, str(step)))
        saved = self.ckpts.save(self.state)
        if saved != step:  # the loop counts what the optimizer counts
            raise RuntimeError(f"saved step {saved}, expected {step}")

    def anyone(self, flag: bool) -> bool:
        if self.processes == 1:
            return flag
        from jax.experimental import multihost_utils

        return bool(np.any(multihost_utils.process_allgather(np.array([flag]))))

    def weights(self) -> dict[str, np.ndarray]:
        """Every parameter under its PyTorch name, whole, on every process."""
        import jax

        from payload.engines.jax.models import state_dict

        params = self.state.params
        if self.processes > 1:
            from jax.experimental import multihost_utils

            params = multihost_utils.process_allgather(params, tiled=True)
        return state_dict(jax.device_get(params))

    def cpu_peak_flops(self) -> float:
        return cpu_peak_flops()

    def close(self) -> None:
        if self.ckpts:
            self.ckpts.close()

    def _barrier(self, name: str) -> None:
        from payload.engines.jax.distributed import meet

        meet(name)

    def coordination(self):
        """JAX's coordination service, hosted by process 0."""
        if self.processes == 1:
            return None
        from payload.engines.jax.distributed import ProcessCoordination

        return ProcessCoordination(index=self.process, count=self.processes)


def _memory_per_device() -> int:
    """Bytes one device may hold: an accelerator's own figure, else the host's memory shared by
    its CPU devices."""
    import jax

    device = jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total // max(1, jax.local_device_count())


def cpu_peak_flops(size: int = PROBE_SIZE, rounds: int = PROBE_ROUNDS,
                   products: int = PROBE_PRODUCTS) -> float:
    """FLOP/s of float32 matrix products on this process's CPU, in JAX's CPU backend
    (payload.training.utilisation.best_rate)."""
    import jax
    import jax.numpy as jnp

    cpu = jax.local_devices(backend="cpu")[0]
    a, b = (jax.device_put(jax.random.uniform(jax.random.key(seed), (size, size)), cpu)
            for seed in (1, 2))

    @jax.jit
    def run(a, b, count):
        # The input changes with i, so no optimiser can hoist the product out of the loop.
        return jax.lax.fori_loop(0, count, lambda i, total: total + jnp.sum((a + i) @ b), 0.0)

    return best_rate(lambda count: float(run(a, b, count)), size=size, rounds=rounds,
                     products=products)
