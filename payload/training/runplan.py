"""What a run will compute, how long that takes and what it costs, before it runs: pure arithmetic.

    plan = run_plan(config, hardware=Hardware.tpu("v4-8", "my-run"), num_workers=1)
    plan.flops_per_step, plan.wall_time_s, plan.cost_usd     # None where there is no table entry
    print("\\n".join(render(plan)))                           # what `tpuctl train --dry-run` shows
    check_batch(plan)                                        # UserError: replicas cannot divide it
    state_sharding(config, hardware)   # the JAX engine's ShardingPlan on a TPU; UserError: no fit
    describe_model(config)     # "roberta base (12 layers, ...): 124.7M parameters, vocabulary ..."
    warnings(plan, dataset_rows=manifest_rows)               # one line per obvious mis-sizing

FLOPs are model FLOPs (what the architecture needs, not what a compiler happens to run), the
standard estimate: 6 per non-embedding parameter per token (2 forward, 4 backward), plus
attention's score and value products, 12 x layers x length x width per token, plus the
vocabulary projection, 6 x vocabulary x width per predicted token (BERT/RoBERTa predict only at
the masked positions, GPT-2 at every position, T5 at every target position). T5 counts encoder
and decoder apart: the encoder's parameters per input token, the decoder's per target token
(the cross-attention keys and values per input token), cross-attention scores over the inputs.
The wall time divides the total by the slice's peak bf16 FLOP/s at an assumed utilisation
(`ASSUMED_UTILISATION`); the cost multiplies that time by the price table's hourly price. On
CPU workers it divides the training and evaluation FLOPs by a `CpuSpeed` the caller found
(launcher.estimate: a measured figure, or a probe of the machine scaled by a calibrated share),
adds the stage's measured start-up, and lists the other stages' times the caller measured;
each figure said with its source.

On a TPU the plan also says how the engine lays the training state over the chips, as the
engine plans it (its spec's plan_sharding, payload.core.engines: the JAX engine replicates it, or splits it
FSDP-wise over the fewest chips whose memory, from the accelerator table, holds it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from payload.core.engines import engine_spec
from payload.core.errors import UserError
from payload.core.families import FAMILIES, family_of
from payload.core.fit.sharding import GIB, state_bytes
from payload.core.flops import StepFlops

# Model FLOPs utilisation assumed for the time and cost estimate: what well-tuned transformer
# pretraining reaches on TPUs (PaLM reported 46%, MaxText's published runs 40-60%); a first run
# of a new configuration is often lower.
ASSUMED_UTILISATION = 0.40
# Fewer training tokens than this many per parameter leaves a model far from trained: the
# warning's threshold. About ENOUGH_TOKENS_PER_PARAMETER is compute-optimal (Hoffmann et al.
# 2022, "Chinchilla"): the figure the warning names as enough.
MIN_TOKENS_PER_PARAMETER = 2
ENOUGH_TOKENS_PER_PARAMETER = 20
# An evaluation batch costs about a third of a training step's FLOPs (the forward pass alone).
EVAL_SHARE_OF_STEP = 1 / 3


@dataclass(frozen=True, kw_only=True)
class CpuSpeed:
    """What training reaches on CPU workers: model FLOP/s of all its processes together, and
    where that figure comes from (the plan says it with the estimate); the train stage's
    start-up before its first step (imports, building and compiling, the first evaluation);
    and the other stages' times, as (stage, seconds or None, how it was worked out)."""

    model_flops_per_s: float
    source: str
    start_s: float = 0.0
    stages: tuple[tuple[str, float | None, str], ...] = ()


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """The run in figures: a plain record, rendered by `render`."""

    family: str
    model: str  # "roberta base", or the family when the shape is given otherwise
    parameters: int
    non_embedding_parameters: int
    steps: int  # train.steps: the whole run's
    start_step: int = 0  # a resumed run's newest checkpoint: time and cost count the rest
    batch_size: int
    seq_len: int
    tokens_per_step: int  # batch x seq_len: the input tokens a step trains on
    total_tokens: int
    flops_per_step: float
    total_flops: float
    flops_formula: str
    # (term, share of a step's FLOPs), largest first: what the family and shape spend them on.
    flops_shares: tuple[tuple[str, float], ...] = ()
    bf16: bool
    continues: bool  # model.init_from: continued pretraining starts from trained weights
    # What the batch is split over: TensorFlow replicas, and what they are in words.
    replicas: int
    replicas_are: str
    # The accelerator table's entry (None: CPU workers, no entry).
    accelerator: str | None = None
    generation: str | None = None
    chips: int | None = None
    peak_flops_per_chip: float | None = None
    # Several slices: one step's gradient all-reduce over the data-center network (seconds at
    # the table's DCN bandwidth, None where it has none) beside the step's compute.
    slices: int = 1
    gradient_bytes: int = 0
    dcn_note: str = ""  # the bandwidth the DCN time is figured at, or why there is none
    dcn_s_per_step: float | None = None
    compute_s_per_step: float | None = None
    utilisation: float = ASSUMED_UTILISATION
    wall_time_s: float | None = None
    # The price table's entry (None: no price for this cluster).
    usd_per_hour: float | None = None
    price_note: str = ""  # "on-demand, us-central2; prices of ..." or why there is no price
    cost_usd: float | None = None
    # CPU workers: where the time estimate's speed comes from, or why there is none; the
    # evaluations and their FLOPs, the train stage's start-up, the other stages' times.
    cpu_note: str = ""
    evaluations: int = 0
    eval_flops: float = 0.0
    start_s: float = 0.0
    stage_times: tuple[tuple[str, float | None, str], ...] = ()
    # How the engine lays the training state over the chips, in words ("" where the engine
    # keeps a whole copy on every replica, or on CPU workers).
    sharding: str = ""
    # What the engine says of how it runs the step (the JAX engine: its attention kernels).
    engine_lines: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def steps_left(self) -> int:
        return max(0, self.steps - self.start_step)

    @property
    def flops_left(self) -> float:
        """The training FLOPs still to do (all of them, unless resumed)."""
        return self.flops_per_step * self.steps_left

    @property
    def cpu_total_s(self) -> float | None:
        """CPU workers: training and the other stages whose time is known, in seconds."""
        if self.wall_time_s is None or self.accelerator is not None:
            return None
        return self.wall_time_s + sum(s for _, s, _ in self.stage_times if s is not None)

    @property
    def peak_flops(self) -> float | None:
        if self.chips is None or self.peak_flops_per_chip is None:
            return None
        return self.chips * self.peak_flops_per_chip


def step_flops(architecture: dict, *, seq_len: int, mlm_probability: float = 0.15,
               target_len: int | None = None) -> StepFlops:
    """Model FLOPs of training on one row: `architecture` is a transformers config dict (with
    model_type); `target_len` is T5's target length (payload.core.families: the family's
    formula, over the positions its head predicts)."""
    spec = family_of(architecture)
    predicted = spec.predicted_len(seq_len, mlm_probability=mlm_probability,
                                   target_len=target_len)
    return spec.flops(architecture, seq_len, predicted)


def row_flops(config, architecture: dict | None = None) -> StepFlops:
    """`step_flops` for one row of the run a RunConfig describes (its architecture unless
    given: the train stage passes the model config it built)."""
    arch = architecture if architecture is not None else run_architecture(config)
    target_len = FAMILIES[config.model.family].target_len(config.model, config.data.seq_len)
    return step_flops(arch, seq_len=config.data.seq_len,
                      mlm_probability=config.model.mlm_probability, target_len=target_len)


# --- the plan ------------------------------------------------------------------------------


def replicas_of(hardware, num_workers: int) -> tuple[int, str]:
    """What a global batch is split over, and what that is in words. On a TPU: one replica per
    device, as the accelerator table counts them (payload.cloud.accelerators.Accelerator.
    in_words, the one wording of chips, TensorCores and devices): TensorFlow's TPUStrategy makes
    one replica per TPU device and JAX one per device of its mesh; v5e and v6e chips have one
    TensorCore, v4 and v5p chips run their two as one "megacore" device (a v4-8 shows 4
    devices, a v4-32 16; see docs/costs.md, "The run plan", for the sources), and a TPU7x chip
    shows each of its two as a device. On CPU workers: one replica per training process
    (MultiWorkerMirroredStrategy), 1 for a single process."""
    from payload.training.strategy import tpu_topology, training_workers

    acc = tpu_topology(hardware)
    if acc is not None:
        return acc.jax_devices, f"one per device: {acc.in_words()}"
    trainers = len(training_workers(hardware, num_workers))
    if trainers == 1:
        return 1, "one CPU training process"
    return trainers, f"one per CPU worker process: {trainers} processes"


def workload(config, hardware, architecture: dict | None = None):
    """What a training step of the run computes where it runs (payload.core.fit.workload): the
    engine's memory plan and its plan lines read it."""
    from payload.core.fit.workload import Workload
    from payload.training.strategy import tpu_topology

    acc = tpu_topology(hardware)
    arch = architecture if architecture is not None else run_architecture(config)
    return Workload.of(arch, model=config.model, data=config.data, train=config.train,
                       platform="tpu" if acc else "cpu",
                       generation=acc.generation if acc else None)


def state_sharding(config, hardware, architecture: dict | None = None):
    """How the run's engine lays the training state over a TPU slice's chips (a ShardingPlan),
    from the model's parameter count, the step's activations and the accelerator table's
    memory per chip; None on CPU workers and for an engine that replicates it. A model or step
    no arrangement of the slice's chips can hold is a one-line UserError with what it needs
    and has, and what would fit."""
    from payload.cloud.accelerators import larger_slices
    from payload.core.sizes import count_parameters
    from payload.training.strategy import tpu_topology

    acc = tpu_topology(hardware)
    if acc is None:
        return None
    arch = architecture if architecture is not None else run_architecture(config)
    return engine_spec(config.train.engine).plan_sharding(
        count_parameters(arch).total, num_devices=acc.jax_devices,
        hbm_bytes_per_chip=acc.hbm_bytes_per_device, optimizer=config.train.optimizer,
        where=acc.name, workload=workload(config, hardware, arch),
        larger=larger_slices(acc.name), num_slices=acc.num_slices)


def run_plan(config, *, hardware, num_workers: int, architecture: dict | None = None,
             utilisation: float = ASSUMED_UTILISATION,
             cpu_speed: CpuSpeed | str | None = None, start_step: int = 0) -> RunPlan:
    """The run's figures. `hardware` is the fleet's (payload.training.strategy.Hardware); the price
    comes from `config.cluster` (zone, provisioning) where the price table has one. On CPU
    workers the time comes from `cpu_speed` (launcher.estimate finds one), or a string saying
    why there is none. A run resumed at `start_step` is timed and priced for the steps left."""
    from payload.core.sizes import count_parameters
    from payload.training.strategy import tpu_topology

    train = config.train
    arch = architecture if architecture is not None else run_architecture(config)
    count = count_parameters(arch)
    engine_lines = tuple(engine_spec(train.engine).plan_lines(workload(config, hardware, arch)))
    per_row = row_flops(config, arch)
    flops_per_step = per_row.total * train.batch_size
    replicas, replicas_are = replicas_of(hardware, num_workers)
    tokens_per_step = train.batch_size * config.data.seq_len
    figures = dict(
        family=config.model.family,
        model=" ".join(filter(None, (config.model.family, config.model.size))),
        parameters=count.total,
        non_embedding_parameters=count.non_embedding, steps=train.steps,
        start_step=min(max(0, start_step), train.steps),
        batch_size=train.batch_size, seq_len=config.data.seq_len,
        tokens_per_step=tokens_per_step, total_tokens=tokens_per_step * train.steps,
        flops_per_step=flops_per_step, total_flops=flops_per_step * train.steps,
        flops_formula=per_row.formula, flops_shares=per_row.shares(), bf16=train.bf16,
        continues=bool(config.model.init_from), replicas=replicas,
        replicas_are=replicas_are, utilisation=utilisation, engine_lines=engine_lines,
    )
    flops_left = flops_per_step * (train.steps - figures["start_step"])
    acc = tpu_topology(hardware)
    if acc is None:
        evals = evaluations(train, start=figures["start_step"])
        eval_flops = evals * train.eval_batches * flops_per_step * EVAL_SHARE_OF_STEP
        figures.update(evaluations=evals, eval_flops=eval_flops)
        if isinstance(cpu_speed, CpuSpeed):
            compute = (flops_left + eval_flops) / cpu_speed.model_flops_per_s
            figures.update(wall_time_s=cpu_speed.start_s + compute, cpu_note=cpu_speed.source,
                           start_s=cpu_speed.start_s, stage_times=cpu_speed.stages)
        else:
            figures.update(cpu_note=cpu_speed or "no measured CPU speed")
        return RunPlan(**figures, notes=tuple(cpu_notes(config)))
    compute_s = flops_per_step / (acc.peak_bf16_flops * utilisation)
    # float32 gradients, all-reduced across the slices once a step (FSDP stays in a slice).
    gradient_bytes = count.total * GRADIENT_BYTES_PER_PARAM
    dcn_s = acc.dcn_allreduce_s(gradient_bytes)
    figures.update(slices=acc.num_slices, gradient_bytes=gradient_bytes, dcn_s_per_step=dcn_s,
                   compute_s_per_step=compute_s, dcn_note=_dcn_note(acc))
    # Not overlapped with the compute: the plan's time is an upper bound where DCN is slow.
    wall = (compute_s + (dcn_s or 0.0)) * (train.steps - figures["start_step"])
    sharding = state_sharding(config, hardware, arch)
    figures.update(accelerator=acc.label, generation=acc.generation, chips=acc.chips,
                   peak_flops_per_chip=acc.peak_bf16_flops_per_chip, wall_time_s=wall,
                   sharding=sharding.describe() if sharding is not None else "")
    notes = []
    if not train.bf16:
        notes.append("train.bf16 is off: float32 matrix products run well below the bf16 "
                     "peak on a TPU, so expect a longer run than this; set train.bf16: true")
    # The cluster asks the price catalog; a cluster tpuctl does not provision has no price.
    price = config.cluster.hourly_price()
    if price is not None:
        label = price.provisioning.replace("_", "-")
        if price.usd_per_hour is not None:
            figures.update(usd_per_hour=price.usd_per_hour,
                           cost_usd=price.cost_usd(wall / 3600),
                           price_note=(f"{label}, ${price.usd_per_hour:,.2f}/h for {acc.label} "
                                       f"in {price.region}; prices of {price.source_date}"))
        else:
            figures.update(price_note=price.describe())
    else:
        figures.update(price_note="no price: tpuctl prices only TPUs it provisions (gcp)")
    return RunPlan(**figures, notes=tuple(notes))


# The JAX engine's gradients are float32 whatever train.bf16 says (payload.engines.jax.step).
GRADIENT_BYTES_PER_PARAM = 4
# A step whose DCN all-reduce takes more than this share of its compute time is warned about.
DCN_WARN_SHARE = 1.0


def _dcn_note(acc) -> str:
    return "" if acc.num_slices == 1 else acc.dcn_words()


def evaluations(train, *, start: int = 0) -> int:
    """How many evaluations a run from step `start` makes (payload.training.loop): the
    untrained baseline of a fresh start, one every train.eval_every steps, and the last step."""
    count = (1 if start == 0 else 0) + train.steps // train.eval_every - start // train.eval_every
    return count + (1 if train.steps % train.eval_every else 0)


def cpu_notes(config) -> list[str]:
    """What of the run's settings does not do on CPU workers what it says."""
    return [engine_spec(config.train.engine).bf16_on_cpu] if config.train.bf16 else []


def check_batch(plan: RunPlan) -> None:
    """Refuse a global batch the replicas cannot split evenly (TensorFlow would fail at the
    first step, after the set-up was paid for)."""
    check_batch_split(plan.batch_size, plan.replicas, plan.replicas_are)


def check_batch_split(batch_size: int, replicas: int, replicas_are: str) -> None:
    if batch_size % replicas:
        below = batch_size // replicas * replicas
        above = below + replicas
        near = f"{below} or {above}" if below else str(above)
        raise UserError(
            f"train.batch_size={batch_size} does not split over the {replicas} replicas "
            f"({replicas_are})",
            hint=f"use a multiple of {replicas}, e.g. {near}",
        )


def warnings(plan: RunPlan, *, dataset_rows: int | None = None) -> list[str]:
    """One line per obvious mis-sizing: too few tokens for the parameters, or fewer rows in the
    dataset (the manifest's training records, when prepare has run) than the run reads."""
    lines = []
    floor = MIN_TOKENS_PER_PARAMETER * plan.parameters
    if plan.total_tokens < floor and not plan.continues:  # from trained weights, few may do
        enough = ENOUGH_TOKENS_PER_PARAMETER * plan.parameters
        steps = math.ceil(enough / plan.tokens_per_step)
        lines.append(
            f"{_count(plan.total_tokens)} training tokens for {_count(plan.parameters)} "
            f"parameters leave the model far from trained: about {_count(enough)} "
            f"({ENOUGH_TOKENS_PER_PARAMETER} per parameter) would be enough, {steps:,} steps "
            f"at this batch; raise train.steps or train.batch_size, or pick a smaller model")
    if (plan.dcn_s_per_step is not None and plan.compute_s_per_step
            and plan.dcn_s_per_step > DCN_WARN_SHARE * plan.compute_s_per_step):
        lines.append(
            f"the gradient all-reduce over DCN ({_seconds(plan.dcn_s_per_step)} a step) takes "
            f"longer than the step's compute ({_seconds(plan.compute_s_per_step)}): the "
            f"{plan.slices} slices wait on the network; use fewer, larger slices or a larger "
            "train.batch_size per step")
    rows = plan.steps * plan.batch_size
    if dataset_rows is not None and dataset_rows < rows:
        lines.append(
            f"the dataset has {dataset_rows:,} training rows but {plan.steps:,} steps x "
            f"{plan.batch_size} read {rows:,}: {rows / max(dataset_rows, 1):.1f} epochs, the "
            "same rows again and again; add data or lower train.steps")
    return lines


# --- words ---------------------------------------------------------------------------------


def render(plan: RunPlan) -> list[str]:
    """The plan as lines for a person: figures with their units and where they come from."""
    lines = [
        f"run plan: {plan.model}, {_count(plan.parameters)} parameters "
        f"({_count(plan.non_embedding_parameters)} without embeddings)",
        f"  tokens: {plan.tokens_per_step:,} per step ({plan.batch_size} rows x "
        f"{plan.seq_len}), {_count(plan.total_tokens)} in {plan.steps:,} steps"
        + (f"; resumed at step {plan.start_step:,}: {plan.steps_left:,} steps left"
           if plan.start_step else ""),
        f"  FLOPs: {_flops(plan.flops_per_step)} per step, {_flops(plan.total_flops)} in total"
        + (f", {_flops(plan.flops_left)} in the steps left" if plan.start_step else ""),
        f"    estimate: {plan.flops_formula}",
        f"  replicas: {plan.replicas} ({plan.replicas_are}); train.batch_size {plan.batch_size} "
        f"= {plan.batch_size // plan.replicas if plan.batch_size % plan.replicas == 0 else '?'}"
        " per replica",
    ]
    lines.append(_cost_drivers(plan))
    lines += [f"  {line}" for line in plan.engine_lines]
    if plan.accelerator is None:
        lines += _cpu_time(plan)
        lines += [f"  note: {note}" for note in plan.notes]
        return lines
    lines.append(
        f"  accelerator: {plan.accelerator}, {plan.chips} chips of TPU {plan.generation}, peak "
        f"{plan.peak_flops_per_chip / 1e12:,.0f} TFLOP/s bf16 per chip "
        f"({plan.peak_flops / 1e12:,.0f} TFLOP/s in all)")
    if plan.sharding:
        lines.append(f"  sharding: {plan.sharding}")
    if plan.slices > 1:
        lines.append(_dcn_line(plan))
    lines.append(
        f"  time: {_duration(plan.wall_time_s)} of training at an assumed "
        f"{plan.utilisation:.0%} utilisation (model FLOPs / peak); set-up, prepare and export "
        "come on top")
    if plan.cost_usd is not None:
        lines.append(f"  cost: ${plan.cost_usd:,.2f} for that time ({plan.price_note})")
    else:
        lines.append(f"  cost: not estimated ({plan.price_note})")
    lines += [f"  note: {note}" for note in plan.notes]
    return lines


def _dcn_line(plan: RunPlan) -> str:
    """One step's gradient all-reduce across the slices, beside its compute."""
    moved = plan.gradient_bytes * 2 * (plan.slices - 1) / plan.slices
    head = (f"  DCN: {_bytes(plan.gradient_bytes)} of float32 gradients all-reduced over "
            f"{plan.slices} slices each step, {_bytes(moved)} through each slice (x 2(S-1)/S)")
    if plan.dcn_s_per_step is None:
        return f"{head}: time not estimated ({plan.dcn_note})"
    return (f"{head}: {_seconds(plan.dcn_s_per_step)} at {plan.dcn_note}, beside "
            f"{_seconds(plan.compute_s_per_step)} of compute per step (counted in the time "
            "below, not overlapped)")


def _bytes(value: float) -> str:
    return f"{value / 1e9:,.2f} GB" if value >= 1e9 else f"{value / 1e6:,.1f} MB"


def _seconds(value: float) -> str:
    return f"{value * 1e3:,.1f} ms" if value < 1 else f"{value:,.2f} s"


def _cpu_time(plan: RunPlan) -> list[str]:
    """The time lines of a run on CPU workers: in all, then the training and the other stages."""
    if plan.wall_time_s is None:
        return [f"  time: not estimated ({plan.cpu_note}); the train stage shows its ETA from "
                "the first steps"]
    unknown = [stage for stage, seconds, _ in plan.stage_times if seconds is None]
    # Every part is said at the grain of the whole, and each sum is the sum of its parts as
    # said: "2 min 18s: 21s to start, then ... in 1 min 57s", never "2 min: 21s ..., in 2 min".
    grain = _grain(plan.cpu_total_s)
    compute = plan.wall_time_s - plan.start_s
    train = _on_grain(plan.start_s, grain) + _on_grain(compute, grain)
    total = train + sum(_on_grain(seconds, grain) for _, seconds, _ in plan.stage_times
                        if seconds is not None)
    lines = [f"  time: about {_duration(total, grain)} on CPU for "
             + ("training" if not plan.stage_times else
                "the stages that run" + (f" but {', '.join(unknown)}" if unknown else ""))]
    steps = (f"{plan.steps_left:,} steps left" if plan.start_step else f"{plan.steps:,} steps")
    lines.append(f"    train: {_duration(train, grain)}: {_duration(plan.start_s, grain)} to "
                 f"start (imports, compiling, the first evaluation), then {steps} and "
                 f"{plan.evaluations} evaluations in {_duration(compute, grain)} "
                 f"({plan.cpu_note})")
    lines += [f"    {stage}: "
              + (_duration(seconds, grain) if seconds is not None else "not estimated")
              + f" ({how})" for stage, seconds, how in plan.stage_times]
    return lines


# What makes each term large, for the line that says where a step's FLOPs go.
_DRIVERS = {
    "vocabulary projection": ("costs vocabulary x width per predicted position: GPT-2 "
                              "predicts every position and T5 every target, BERT/RoBERTa only "
                              "the masked ~15%; a smaller tokenizer.vocab_size cuts it"),
    "layers' matrices": "grow with hidden size squared x layers",
    "attention": ("grows with data.seq_len squared per row: shorter rows cost less per "
                  "token"),
}


def _cost_drivers(plan: RunPlan) -> str:
    """Where a step's FLOPs go, largest first, and what makes the largest one large."""
    if not plan.flops_shares:
        return "  FLOPs by term: not worked out"
    shares = ", ".join(f"{name} {share:.0%}" for name, share in plan.flops_shares)
    top = plan.flops_shares[0][0]
    return f"  FLOPs by term: {shares}; most goes to the {top}, which {_DRIVERS[top]}"


def _count(n: float) -> str:
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:,.1f}{unit}"
    return f"{n:,.0f}"


def _flops(n: float) -> str:
    if n <= 0:
        return "0"
    exponent = math.floor(math.log10(n))
    return f"{n / 10 ** exponent:.2f}e{exponent}"


def _grain(seconds: float | None) -> int:
    """The unit a duration this long is said in: seconds under an hour, minutes under two days,
    hours beyond."""
    if seconds is None or not math.isfinite(seconds) or seconds < 3600:
        return 1
    return 60 if seconds < 48 * 3600 else 3600


def _on_grain(seconds: float, grain: int) -> int:
    """`seconds` rounded to the grain (half up), so that parts said at one grain add up."""
    return math.floor(max(0.0, seconds) / grain + 0.5) * grain


def _duration(seconds: float | None, grain: int | None = None) -> str:
    """A duration at its grain (_grain), or at the grain of the whole it is a part of.

    >>> _duration(138.4), _duration(21.2, 1), _duration(117.2, 1)
    ('2 min 18s', '21s', '1 min 57s')
    >>> _duration(124_732.7), _duration(20, 60), _duration(200_000)
    ('34h39m', 'under 1 min', '56 h (2.3 days)')
    """
    if seconds is None or not math.isfinite(seconds):
        return "?"
    grain = grain or _grain(seconds)
    said = _on_grain(seconds, grain)
    if said == 0 and seconds > 0 and grain > 1:
        return f"under 1 {'min' if grain == 60 else 'h'}"
    if grain == 3600:
        return f"{said // 3600:,} h ({said / 86400:.1f} days)"
    minutes, rest = divmod(said, 60)
    if minutes == 0:
        return f"{rest}s"
    if minutes < 60:
        return f"{minutes} min" + (f" {rest:02d}s" if rest else "")
    return f"{minutes // 60}h{minutes % 60:02d}m"


def run_architecture(config) -> dict:
    """The transformers config a run's model has, with the vocabulary its tokenizer gives it."""
    from payload.core.sizes import architecture
    from payload.data.tokenizer import planned_vocab_size

    return architecture(config, planned_vocab_size(config))


def describe_model(config) -> str:
    """One line for a plan: the architecture and its parameter count, e.g.
    "roberta base (12 layers, hidden 768, 12 heads): 124.7M parameters, vocabulary 50,265"."""
    from payload.core.sizes import count_parameters, shape_of

    model = config.model
    settings = run_architecture(config)
    count = count_parameters(settings)
    if model.init_from or model.config:
        source = (f"from model.init_from {model.init_from}" if model.init_from
                  else f"as {model.config}")
        what = f"{model.family} {source}"
    else:
        s = shape_of(model)
        what = (f"{model.family}{' ' + model.size if model.size else ''} ({s.num_layers} layers, "
                f"hidden {s.hidden_size}, {s.num_heads} heads)")
    return (f"{what}: {count.total / 1e6:,.1f}M parameters, vocabulary "
            f"{settings['vocab_size']:,}")


# --- memory on CPU workers -------------------------------------------------------------------

# What one CPU training process holds before any model: the interpreter with TensorFlow (the
# input pipeline, either engine), JAX or Keras, and their runtimes. Measured here: 1.4-1.6 GB
# resident for a tiny model's train stage, either engine.
CPU_PROCESS_BASE_BYTES = int(1.5 * GIB)
# The training state per parameter is the fit's (payload.core.fit.sharding.state_bytes): both
# engines keep a whole copy on every CPU process.
# The share of the machine's memory training processes may fill; the system, the launcher and
# the page cache keep the rest.
USABLE_SHARE_OF_MEMORY = 0.9
# What a CPU training process of each engine holds beyond the counts above is its spec's
# cpu_memory_factors (payload.core.engines), factors on the training state and on the
# activations' floor: measured here as peak resident memory of the train stage (GPT-2 small,
# vocabulary 8,000, rows of 128, two local processes of 4 and of 16 rows each: JAX 3.7 and
# 5.4 GiB, TensorFlow 5.2 and 7.6 GiB; the two shapes give each engine's two factors): the
# copies and buffers each engine's step and runtime keep beside the counts (not broken down
# further here).


@dataclass(frozen=True, kw_only=True)
class CpuMemory:
    """What the training processes on one machine need, each and together, in bytes."""

    processes: int
    state: int  # weights, gradients, optimizer moments and the engine's copies, one process
    activations: int  # what one process's share of a step keeps for its backward pass
    base: int = CPU_PROCESS_BASE_BYTES
    rows: int  # rows of the global batch one process computes

    @property
    def per_process(self) -> int:
        return self.state + self.activations + self.base

    @property
    def total(self) -> int:
        return self.per_process * self.processes

    def describe(self, optimizer: str) -> str:
        return (f"{_gib(self.per_process)} per training process (weights, gradients, "
                f"{optimizer} moments and their working copies {_gib(self.state)}, activations "
                f"of {self.rows} rows {_gib(self.activations)}, the process itself "
                f"{_gib(self.base)}), {_gib(self.total)} for {self.processes}")


def cpu_memory(config, architecture: dict, *, processes: int,
               optimizer: str | None = None) -> CpuMemory:
    """What `processes` CPU training processes of this run need on one machine: each holds the
    whole training state, its rows' activations and itself. The state counts
    state_bytes; the activations' floor per layer and token the inputs of its
    products (6 x width), the feed-forward's inner values (2 x its width) and attention's
    probabilities (heads x length), float32, plus the logits and their gradient at the
    predicted positions; each then x the engine's measured cpu_memory_factors."""
    from payload.core.sizes import count_parameters

    optimizer = optimizer or config.train.optimizer
    params = count_parameters(architecture).total
    rows = max(1, config.train.batch_size // max(1, processes))
    seq = config.data.seq_len
    dims = family_of(architecture).dims(architecture)
    width, layers, heads, inner = dims.width, dims.all_layers, dims.heads, dims.ff
    per_token = layers * (6 * width + 2 * inner + heads * seq)
    predicted = row_flops(config, architecture).vocabulary / (6 * architecture["vocab_size"]
                                                              * width)
    floats = rows * (seq * per_token + 2 * predicted * architecture["vocab_size"])
    state_factor, activation_factor = engine_spec(config.train.engine).cpu_memory_factors
    return CpuMemory(processes=processes,
                     state=int(state_bytes(params, optimizer) * state_factor),
                     activations=int(4 * floats * activation_factor), rows=rows)


def _gib(n: float) -> str:
    return f"{n / GIB:,.1f} GiB"
