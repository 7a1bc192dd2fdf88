"""The local training: the trainer, data, optimizer, precision, the LR control and the job module."""
