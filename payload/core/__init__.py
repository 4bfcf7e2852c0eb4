"""The shared ground: the project errors, storage, stage names, the layout of output_dir, and the model
families and sizes that the run config names."""
