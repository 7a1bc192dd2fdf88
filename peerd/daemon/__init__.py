"""The control plane: the peerd daemon. It never imports torch."""
