"""The pipeline's stages that run above the engines: train, export, publish (python -m payload)."""
