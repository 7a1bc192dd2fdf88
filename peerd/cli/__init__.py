"""Command-line entry points: `peerd` and `peerctl`."""
