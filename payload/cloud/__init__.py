"""What a cloud offers and costs: accelerator shapes, the price catalog, the TPU API, budgets."""
