"""A daemon's own workers as the innermost group, on torch.distributed (docs/algorithms.md, "Hierarchical crossover")."""
