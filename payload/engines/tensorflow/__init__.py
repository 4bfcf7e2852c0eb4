"""The TensorFlow engine: transformers' TF classes under tf.distribute (TPU VMs up to v5p, CPU).

    from payload.engines.tensorflow.engine import ENGINE
"""
