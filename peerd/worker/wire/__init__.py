"""Bytes between workers: the transports (gRPC and the bulk lane), the codec, the stores partners read from, traffic counts."""
