"""Model and training: the model, the strategy, the train loop, checkpoints, export, publish."""
