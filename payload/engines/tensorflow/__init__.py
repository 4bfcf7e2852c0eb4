"""The TensorFlow engine: transformers' TF classes under tf.distribute (TPU VMs up to v5p, CPU).

    from payload.engines.tensorflow.engine import trainer, trained_weights
"""

import os

# Transformers' TF models need tf-keras; touching Keras 3 first breaks their optimizers. Set
# before any module of this engine imports TensorFlow.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
