"""The JAX engine's training step: one jitted (state, batch) -> (state, metrics) per objective,
sharding declared on a device mesh, host batches entering through one function.

    mesh = make_mesh(plan)      # plan: payload.core.fit.sharding.plan_sharding's ShardingPlan
    program = TrainProgram(hf_config, family="gpt2", train_cfg=config.train, mesh=mesh)
    state = program.init_state(seed=0)                   # float32 weights, placed on the mesh
    batch = program.global_batch(numpy_rows_of_this_host)
    state, metrics = program.train_step(state, batch)    # metrics: loss, accuracy, ...

Loss and accuracy are the TF engine's (payload.engines.tensorflow.model.forward/loss_sums): summed cross-entropy
over the predicted tokens of the whole global batch, divided by their count; a masked LM projects
onto the vocabulary only at its masked positions; GPT-2 predicts the next token; T5 the labels
after the decoder inputs. The step computes it a chunk of positions at a time
(payload.engines.jax.loss), never holding the [B, T, V] float32 logits; `predictions` and
`loss_sums` below are the plain form it is tested against. Weights stay float32 (the
optimizer's master copy); with bf16 on an accelerator the matmuls run in bfloat16, on CPU
always in float32. The attention kernel follows the platform (payload.core.fit.attention),
the layers' rematerialisation `remat` (payload.engines.jax.kernels.remat_policy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from payload.core.families import FAMILIES
from payload.core.fit.sharding import ShardingPlan
from payload.engines.jax import optimizer as jax_optimizer
from payload.engines.jax.init import draw_params, place
from payload.engines.jax.kernels import Runtime
from payload.engines.jax.loss import loss_sums as chunked_loss_sums
from payload.engines.jax.models import build_model, model_shapes

DATA, FSDP = "data", "fsdp"
BATCH_AXES = (DATA, FSDP)  # the batch is split over every device, whatever the mesh's shape
IGNORE_INDEX = -100
# Parameters smaller than this stay replicated under FSDP: splitting them saves nothing and
# costs a gather each.
MIN_SHARDED_ELEMENTS = 1 << 14


# --- the mesh and parameters' places ------------------------------------------------------------------


def parameter_spec(shape: tuple[int, ...], fsdp: int,
                   min_elements: int = MIN_SHARDED_ELEMENTS) -> P:
    """Where a parameter lives: replicated, or (under FSDP) split along its largest dimension
    that the group divides, as MaxText's fsdp axis splits the embedding or hidden dimension."""
    if fsdp == 1 or math.prod(shape) < min_elements:
        return P()
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if shape[dim] % fsdp == 0:
            return P(*[FSDP if d == dim else None for d in range(len(shape))])
    return P()


def make_mesh(plan: ShardingPlan, devices=None) -> Mesh:
    """The device mesh (data, fsdp) over every device of every process. Over several slices the
    data axis is hybrid, the slices outermost (DCN), so an FSDP group lies within one slice and
    only the gradients' all-reduce crosses the data-center network."""
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) != plan.num_devices:
        raise ValueError(f"the plan is for {plan.num_devices} devices, there are {len(devices)}")
    if plan.slices == 1:
        return Mesh(np.array(devices).reshape(plan.data, plan.fsdp), (DATA, FSDP))
    groups = slice_groups(devices, plan.slices)
    if len(groups[0]) % plan.fsdp:
        raise ValueError(f"FSDP over {plan.fsdp} devices would span slices of "
                         f"{len(groups[0])}: the state is sharded within a slice only")
    per_slice = (plan.data // plan.slices, plan.fsdp)
    if len({getattr(d, "slice_index", 0) for d in devices}) == plan.slices:
        # TPU slices: JAX orders each slice's devices along its ICI links.
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_hybrid_device_mesh(per_slice, (plan.slices, 1), devices)
    else:
        grid = np.concatenate([np.array(g).reshape(per_slice) for g in groups])
    return Mesh(grid, (DATA, FSDP))


def slice_groups(devices, slices: int) -> list[list]:
    """The devices of each slice, slice 0 first: by the slice each TPU device says it is on,
    or, where every device says 0 (CPU workers standing for slices), by process, consecutive
    processes forming one slice (worker i is on slice i // workers per slice, as the launcher
    numbers them)."""
    if len({getattr(d, "slice_index", 0) for d in devices}) == slices:
        def key(d):
            return d.slice_index
    else:
        processes = sorted({d.process_index for d in devices})
        if len(processes) % slices:
            raise ValueError(f"{len(processes)} processes do not make {slices} equal slices")
        per = len(processes) // slices

        def key(d):
            return processes.index(d.process_index) // per
    ordered = sorted(devices, key=lambda d: (key(d), d.process_index, d.id))
    return [[d for d in ordered if key(d) == s] for s in range(slices)]


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(BATCH_AXES))


def global_batch(local: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This host's rows of a global batch (numpy, from its own input pipeline) as global jax
    arrays: rows of host i follow those of host i - 1. The one way data enters the step."""
    sharding = batch_sharding(mesh)
    return {key: jax.make_array_from_process_local_data(sharding, np.asarray(value))
            for key, value in local.items()}


def compute_dtype(bf16: bool, platform: str | None = None):
    """bfloat16 matmuls where asked and an accelerator runs them; float32 on CPU, where bfloat16
    is only slower."""
    platform = platform or jax.default_backend()
    return jnp.bfloat16 if bf16 and platform != "cpu" else jnp.float32


# --- the objectives ------------------------------------------------------------------------


def predictions(model, batch: dict, *, family: str, dropout_rng=None):
    """(float32 logits [B, T, V], labels [B, T] with -100 = nothing to predict), as the TF
    engine's payload.engines.tensorflow.model.forward gives them; a masked LM's T is its masked
    slots per row. The family's objective (payload.core.families) decides what is predicted."""
    objective = FAMILIES[family].objective
    if objective == "mlm":
        logits = model(batch["input_ids"], batch["attention_mask"],
                       positions=batch["masked_positions"], dropout_rng=dropout_rng)
        labels = jnp.where(batch["masked_weights"] > 0, batch["masked_ids"], IGNORE_INDEX)
        return logits, labels
    if objective == "clm":
        logits = model(batch["input_ids"], batch["attention_mask"], dropout_rng=dropout_rng)
        return logits[:, :-1], batch["labels"][:, 1:]
    logits = model(batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"],
                   dropout_rng=dropout_rng)
    return logits, batch["labels"]


def head_inputs(model, batch: dict, *, family: str, dropout_rng=None):
    """`predictions` before the vocabulary projection: (what the projection takes [B, T, d],
    labels [B, T], the projection), for the chunked loss."""
    objective = FAMILIES[family].objective
    if objective == "mlm":
        x, projection = model.features(batch["input_ids"], batch["attention_mask"],
                                       positions=batch["masked_positions"],
                                       dropout_rng=dropout_rng)
        labels = jnp.where(batch["masked_weights"] > 0, batch["masked_ids"], IGNORE_INDEX)
        return x, labels, projection
    if objective == "clm":
        x, projection = model.features(batch["input_ids"], batch["attention_mask"],
                                       dropout_rng=dropout_rng)
        return x[:, :-1], batch["labels"][:, 1:], projection
    x, projection = model.features(batch["input_ids"], batch["attention_mask"],
                                   batch["decoder_input_ids"], dropout_rng=dropout_rng)
    return x, batch["labels"], projection


def loss_sums(logits, labels):
    """(summed cross-entropy, predicted tokens, correctly predicted tokens), float32: the plain
    form over whole logits, which payload.engines.jax.loss.loss_sums is held to."""
    valid = labels != IGNORE_INDEX
    safe = jnp.where(valid, labels, 0)
    xent = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), safe)
    weight = valid.astype(jnp.float32)
    correct = (jnp.argmax(logits, axis=-1) == safe).astype(jnp.float32) * weight
    return jnp.sum(xent * weight), jnp.sum(weight), jnp.sum(correct)


# --- state and steps -----------------------------------------------------------------------


@partial(jax.tree_util.register_dataclass, data_fields=["params", "opt_state"], meta_fields=[])
@dataclass(frozen=True)
class TrainState:
    """Float32 parameters (an nnx.State under the PyTorch names) and the optimizer's state,
    whose update count is the step."""

    params: nnx.State
    opt_state: optax.OptState

    @property
    def step(self) -> jax.Array:
        return jax_optimizer.update_count(self.opt_state)


class TrainProgram:
    """The model's structure, the optimizer and the mesh, and the jitted steps over them."""

    def __init__(self, hf_config, *, family: str, train_cfg, mesh: Mesh, dtype=None,
                 min_sharded_elements: int = MIN_SHARDED_ELEMENTS, remat: str = "none",
                 runtime: Runtime | None = None):
        self.family, self.train_cfg, self.mesh = family, train_cfg, mesh
        self.config = hf_config
        self.dtype = dtype if dtype is not None else compute_dtype(train_cfg.bf16)
        self.runtime = runtime if runtime is not None else Runtime.here(mesh=mesh, remat=remat)
        self.fsdp = mesh.shape[FSDP]
        self.graphdef, abstract = nnx.split(model_shapes(hf_config, dtype=self.dtype,
                                                         runtime=self.runtime))
        self.tx = jax_optimizer.build_optimizer(train_cfg)
        self.param_sharding = jax.tree.map(
            lambda leaf: NamedSharding(mesh, parameter_spec(tuple(leaf.shape), self.fsdp,
                                                            min_sharded_elements)),
            abstract)
        abstract_opt = jax.eval_shape(self.tx.init, abstract)
        # Optimizer moments shaped like a parameter live where it does; counters replicated.
        self.opt_sharding = _like_params(abstract_opt, abstract, self.param_sharding, mesh)
        self.state_sharding = TrainState(params=self.param_sharding, opt_state=self.opt_sharding)
        self.batch_sharding = batch_sharding(mesh)
        self.dropout_key = jax.random.key(train_cfg.seed)
        self.train_step = jax.jit(self._train_step, in_shardings=(self.state_sharding, None),
                                  out_shardings=(self.state_sharding, None), donate_argnums=0)
        self.eval_step = jax.jit(self._eval_step, in_shardings=(self.param_sharding, None))

    def init_state(self, *, seed: int) -> TrainState:
        """Fresh weights as the original implementations draw them and a fresh optimizer, made
        on the host and placed into their shardings (payload.engines.jax.init): no compile."""
        return self._placed_state(draw_params(self.config, seed=seed, dtype=self.dtype))

    def abstract_state(self) -> TrainState:
        """The state's shapes, dtypes and shardings, nothing allocated: what a restore fills."""
        shapes = jax.eval_shape(lambda: self.init_state_fn(0)())
        return jax.tree.map(lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                                     sharding=sharding),
                            shapes, self.state_sharding)

    def init_state_fn(self, seed: int):
        def init():
            params = nnx.state(build_model(self.config, seed=seed, dtype=self.dtype))
            return TrainState(params=params, opt_state=self.tx.init(params))

        return init

    def state_from_params(self, params: nnx.State) -> TrainState:
        """A fresh optimizer over given weights (init_from), placed on the mesh."""
        return self._placed_state(jax.tree.map(np.asarray, params))

    def _placed_state(self, host_params: nnx.State) -> TrainState:
        """Host weights and the optimizer's fresh state over them, each leaf placed as its own
        buffer where the state's shardings say."""
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            opt_state = jax.tree.map(np.asarray, self.tx.init(host_params))
        return TrainState(params=place(host_params, self.param_sharding),
                          opt_state=place(opt_state, self.opt_sharding))

    def global_batch(self, local: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        return global_batch(local, self.mesh)

    def _loss(self, params, batch, dropout_rng):
        model = nnx.merge(self.graphdef, params)
        x, labels, projection = head_inputs(model, batch, family=self.family,
                                            dropout_rng=dropout_rng)
        xent, count, correct = chunked_loss_sums(x, labels, projection)
        count = jnp.maximum(count, 1.0)
        return xent / count, (count, correct)

    def _train_step(self, state: TrainState, batch: dict):
        # A fresh dropout key per step, from the run's seed and the step: a resumed run draws
        # what an uninterrupted one draws.
        rng = jax.random.fold_in(self.dropout_key, state.step)
        (loss, (count, correct)), grads = jax.value_and_grad(self._loss, has_aux=True)(
            state.params, batch, rng)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, "accuracy": correct / count, "tokens": count,
                   "grad_norm": optax.tree.norm(grads)}
        return TrainState(params=params, opt_state=opt_state), metrics

    def _eval_step(self, params, batch: dict):
        model = nnx.merge(self.graphdef, params)
        x, labels, projection = head_inputs(model, batch, family=self.family)
        return jnp.stack(chunked_loss_sums(x, labels, projection))


def _like_params(opt_tree, params, param_sharding, mesh: Mesh):
    """Shardings for an optimizer state: a subtree shaped like the parameters (Adam's moments)
    takes their shardings where a leaf has its parameter's shape; anything else (counters,
    Adafactor's row and column statistics) is replicated."""
    param_struct = jax.tree.structure(params)
    replicated = NamedSharding(mesh, P())

    def like(node) -> bool:
        return jax.tree.structure(node) == param_struct

    def place(node):
        if like(node):
            return jax.tree.map(
                lambda leaf, p, s: s if tuple(leaf.shape) == tuple(p.shape) else replicated,
                node, params, param_sharding)
        return jax.tree.map(lambda _: replicated, node)

    return jax.tree.map(place, opt_tree, is_leaf=like)
