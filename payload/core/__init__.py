"""The shared core: the run config, the project errors, storage, stage names and the layout of output_dir."""
