"""Model and training: families, sizes, the strategy, the train loop, checkpoints, export, publish."""
