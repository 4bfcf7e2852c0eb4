"""Training engines, one folder each: what differs between frameworks (model, step, checkpoints)."""
