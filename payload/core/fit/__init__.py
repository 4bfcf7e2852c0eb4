"""Whether a training step fits the chips, worked out without a framework: the attention kernel
each call takes (attention), what a step holds beside its state (memory), and how the state is
laid over a slice's chips (sharding), for a step described once (workload). The JAX engine's
spec (payload.core.engines) answers with them, so the config check, the run plan and the
dry run say what the step will do before any framework or TPU hour.
"""
