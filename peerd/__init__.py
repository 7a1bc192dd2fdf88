"""peerd: decentralised, elastic training for labs full of mismatched GPU machines."""

__version__ = "0.1.0"
