"""Pure cores: deterministic decisions with no I/O, no event loop and no torch.

Time and randomness are arguments, so every peer computes the same answer from
the same inputs and a test or simulator can drive them directly.
"""
