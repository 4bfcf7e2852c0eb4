"""The TensorFlow engine's trainer: transformers' TF model under a tf.distribute strategy.

    trainer = TensorFlowTrainer(config, inputs, plan)   # payload.training.trainer.Trainer
    step = trainer.start(resume=False); trainer.open_train(step)
    loss_sum, first_bad = trainer.train_chunk(10)

The model and optimizer are built under the strategy's scope; a chunk of steps is one
tf.function over the distributed input iterator; every replica's gradients are summed and
clipped by their global norm; checkpoints are TensorFlow's (payload.engines.tensorflow.checkpoints).
The shared loop (payload.training.loop) says when.
"""

from __future__ import annotations

from payload.engines.tensorflow import checkpoints
from payload.engines.tensorflow.distribute import WorkerCoordination, build_strategy
from payload.training.inputs import check_batch_size
from payload.training.strategy import StrategyKind
from payload.training.utilisation import PROBE_PRODUCTS, PROBE_ROUNDS, PROBE_SIZE, best_rate


class TensorFlowTrainer:
    def __init__(self, config, inputs, plan):
        import tensorflow as tf
        import tf_keras

        from payload.engines.tensorflow.model import build_model
        from payload.engines.tensorflow.optimization import build_optimizer

        self.config, self.inputs, self.plan = config, inputs, plan
        self.strategy = strategy = build_strategy(plan)
        check_batch_size(config.train.batch_size, strategy.num_replicas_in_sync)
        self.replicas = self.devices = strategy.num_replicas_in_sync
        self.drives_tpu = isinstance(strategy, tf.distribute.TPUStrategy)
        self.family = config.model.family
        tf_keras.mixed_precision.set_global_policy(
            "mixed_bfloat16" if config.train.bf16 else "float32"
        )
        # The same initial weights on every start: a run restarted from scratch (after a crash
        # before its first checkpoint) ends where an uninterrupted one does.
        tf_keras.utils.set_random_seed(config.train.seed)
        with strategy.scope():
            self.model = build_model(inputs.hf_config)
            self.optimizer, _ = build_optimizer(config.train)
            self.optimizer.build(self.model.trainable_variables)
        self.ckpts = None
        self.init_source = None
        self.input_wait_s = None  # the batches are taken inside the compiled chunk: not seen
        self._train_chunk = self._eval_chunk = None
        self._eval_dataset = None

    @property
    def latest(self) -> str | None:
        return self.ckpts.latest if self.ckpts else None

    def start(self, *, resume: bool) -> int:
        config = self.config
        self.ckpts = checkpoints.Checkpoints(
            config.output_dir, model=self.model, optimizer=self.optimizer,
            keep=config.train.keep_checkpoints, is_chief=self.plan.is_chief, resume=resume)
        if resume:
            self.ckpts.restore_latest()
        elif config.model.init_from:
            from payload.engines.tensorflow.pretrained import load_weights

            self.init_source = load_weights(self.model, config.model.init_from)
        return int(self.optimizer.iterations.numpy())

    # --- data --------------------------------------------------------------------------

    def _dataset(self, host_batches):
        """The strategy's input from the neutral reader (payload.data.stream): each input
        pipeline is one host of the global batch (`host_batches(host, num_hosts)`: numpy), cut
        into its replicas' rows in order, which is the order the strategy hands them out."""
        import tensorflow as tf

        config = self.config

        def make(context: tf.distribute.InputContext):
            per_replica = context.get_per_replica_batch_size(config.train.batch_size)
            host, hosts = context.input_pipeline_id, context.num_input_pipelines
            signature = {name: tf.TensorSpec(shape, tf.as_dtype(dtype)) for name, (shape, dtype)
                         in self.inputs.feature_shapes(per_replica).items()}

            def replicas():
                for features in host_batches(host, hosts):
                    rows = len(features["input_ids"])
                    for lo in range(0, rows, per_replica):
                        yield {k: v[lo:lo + per_replica] for k, v in features.items()}

            dataset = tf.data.Dataset.from_generator(replicas, output_signature=signature)
            return dataset.prefetch(2)

        return self.strategy.distribute_datasets_from_function(make)

    def open_train(self, start_batch: int) -> None:
        # Held by the trainer: destroying a distributed input iterator mid-stream took 20 s on
        # a worker here; a multi-worker process ends before that (distribute.exit_together).
        chief = self.plan.is_chief
        self.iterator = iter(self._dataset(lambda host, hosts: self.inputs.train_batches(
            start_batch, host=host, num_hosts=hosts, digest=chief and host == 0)))

    def compile_step(self) -> None:
        return None  # tf.function traces and compiles in the first step

    # --- compiled steps ----------------------------------------------------------------

    def _build_steps(self):
        import tensorflow as tf

        from payload.engines.tensorflow.model import forward, loss_sums

        model, optimizer, family = self.model, self.optimizer, self.family
        strategy, max_norm = self.strategy, self.config.train.max_grad_norm
        variables = model.trainable_variables
        total = tf.distribute.ReduceOp.SUM

        def train_step(batch):
            context = tf.distribute.get_replica_context()
            with tf.GradientTape() as tape:
                logits, labels = forward(model, batch, family=family, training=True)
                xent, count, _ = loss_sums(logits, labels)
                # Normalise by the count over all replicas: the summed gradients are then the
                # gradient of the global mean loss, whatever the split.
                loss = xent / tf.maximum(context.all_reduce(total, count), 1.0)
            grads = tape.gradient(loss, variables)
            pairs = [(g, v) for g, v in zip(grads, variables, strict=True) if g is not None]
            summed = context.all_reduce(total, [g for g, _ in pairs])
            clipped, _ = tf.clip_by_global_norm(summed, max_norm)
            optimizer.apply_gradients(
                zip(clipped, [v for _, v in pairs], strict=True), skip_gradients_aggregation=True
            )
            return loss

        @tf.function
        def train_chunk(iterator, num_steps):
            loss_sum = tf.constant(0.0)
            first_bad = tf.constant(-1)
            for i in tf.range(num_steps):
                loss = strategy.reduce(
                    total, strategy.run(train_step, (next(iterator),)), axis=None
                )
                finite = tf.math.is_finite(loss)
                first_bad = tf.where((first_bad < 0) & ~finite, i, first_bad)
                loss_sum += tf.where(finite, loss, 0.0)
            return loss_sum, first_bad

        def eval_step(batch):
            logits, labels = forward(model, batch, family=family, training=False)
            return tf.stack(loss_sums(logits, labels))

        @tf.function
        def eval_chunk(iterator, num_steps):
            sums = tf.zeros([3])
            for _ in tf.range(num_steps):
                sums += strategy.reduce(
                    total, strategy.run(eval_step, (next(iterator),)), axis=None
                )
            return sums

        self._train_chunk, self._eval_chunk = train_chunk, eval_chunk

    def train_chunk(self, num_steps: int) -> tuple[float, int]:
        import tensorflow as tf

        if self._train_chunk is None:
            self._build_steps()
        loss_sum, first_bad = self._train_chunk(self.iterator, tf.constant(num_steps))
        return float(loss_sum), int(first_bad)

    def evaluate(self, num_batches: int) -> tuple[float, float, float]:
        import tensorflow as tf

        if self._eval_chunk is None:
            self._build_steps()
        if self._eval_dataset is None:
            self._eval_dataset = self._dataset(
                lambda host, hosts: self.inputs.eval_batches(host=host, num_hosts=hosts))
        xent, count, correct = (float(x) for x in self._eval_chunk(
            iter(self._eval_dataset), tf.constant(num_batches)))
        return xent, count, correct

    # --- the rest ----------------------------------------------------------------------

    def save(self, step: int) -> None:
        self.ckpts.save(step)

    def anyone(self, flag: bool) -> bool:
        if self.plan.kind is not StrategyKind.CPU_MULTI_WORKER:
            return flag  # one process drives every replica
        import tensorflow as tf

        value = 1.0 if flag else 0.0
        anyone = self.strategy.reduce(tf.distribute.ReduceOp.MAX, self.strategy.run(
            lambda: tf.constant(value)), axis=None)
        return float(anyone) > 0

    def weights(self) -> dict:
        from payload.engines.tensorflow.export import pytorch_state_dict

        return pytorch_state_dict(self.model)

    def cpu_peak_flops(self) -> float:
        return cpu_peak_flops()

    def close(self) -> None:
        if self.ckpts:
            self.ckpts.close()

    def coordination(self):
        """The chief's coordination service, for a multi-worker CPU run (a TPU run is one
        process driving every replica)."""
        if self.plan.kind is not StrategyKind.CPU_MULTI_WORKER:
            return None
        resolver = self.strategy.cluster_resolver
        return WorkerCoordination(index=resolver.task_id,
                                  count=resolver.cluster_spec().num_tasks("worker"))


def cpu_peak_flops(size: int = PROBE_SIZE, rounds: int = PROBE_ROUNDS,
                   products: int = PROBE_PRODUCTS) -> float:
    """FLOP/s of float32 matrix products on this process's CPU threads, in TensorFlow
    (payload.training.utilisation.best_rate)."""
    import tensorflow as tf

    a = tf.random.stateless_uniform([size, size], seed=[1, 2])
    b = tf.random.stateless_uniform([size, size], seed=[3, 4])

    @tf.function
    def run(count):
        total = tf.constant(0.0)
        for i in tf.range(count):
            # The input changes with i, so no optimiser can hoist the product out of the loop.
            total += tf.reduce_sum(tf.matmul(a + tf.cast(i, tf.float32), b))
        return total

    return best_rate(lambda count: float(run(tf.constant(count))), size=size, rounds=rounds,
                     products=products)
