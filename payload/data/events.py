"""TensorBoard's event files: TFRecords of summaries, written through TensorFlow's file system.

    writer = EventWriter(layout.join(out, layout.LOGS_DIR, layout.TENSORBOARD_DIR))
    writer.scalars(50, {"train/loss": 7.6, "train/learning_rate": 8.4e-4})
    writer.flush()

Written with `tf.summary`, whose file system reaches gs:// (TensorFlow is the CPU input library
of either engine). Each engine's trainer hands one to the training core (Trainer.summary_writer),
which never imports TensorFlow itself.
"""

from __future__ import annotations


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
