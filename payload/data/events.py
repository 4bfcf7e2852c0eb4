"""TensorBoard's event files: TFRecords of summaries, written through TensorFlow's file system.

    writer = EventWriter(layout.join(out, layout.LOGS_DIR, layout.TENSORBOARD_DIR))
    writer.scalars(50, {"train/loss": 7.6, "train/learning_rate": 8.4e-4})
    writer.flush()

Written with `tf.summary`, whose file system reaches gs://. Each engine's trainer hands one to
the training core (Trainer.summary_writer), which never imports TensorFlow itself.
"""

from __future__ import annotations

import contextlib


def keep_tensorflow_on_the_cpu() -> None:
    """On a host whose accelerators another framework computes on (the JAX engine), TensorFlow
    only writes events: it must not claim the GPUs (the TPU is kept from it by
    TPU_LOAD_LIBRARY=0 in the plan's environment)."""
    import tensorflow as tf

    # RuntimeError: TensorFlow placed something already (it found no GPU to claim then).
    with contextlib.suppress(RuntimeError):
        tf.config.set_visible_devices([], "GPU")


class EventWriter:
    """Scalars into one events file under `folder`, local or gs://."""

    def __init__(self, folder: str):
        import tensorflow as tf

        self._tf = tf
        self._writer = tf.summary.create_file_writer(folder)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        with self._writer.as_default(step=step):
            for tag, value in values.items():
                self._tf.summary.scalar(tag, value)

    def flush(self) -> None:
        self._writer.flush()
