"""peerd: decentralised, elastic training for labs full of mismatched GPU machines."""

import os

__version__ = "0.1.0"

# gRPC's fork handlers run in the child of every fork() of a process whose gRPC
# threads are busy, and may crash it before it can exec (a worker the daemon had
# just started died with SIGSEGV, seen under load; grpc/grpc#13998). peerd's
# processes only fork to exec (workers, the standby, DataLoader servers) and never
# use gRPC in a child, so the handlers are off unless the user turned them on.
# Set before grpc is imported; inherited by every process peerd starts.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# gRPC's core logs every failed TLS handshake (a peer of another CA, say) as its
# own INFO line on stderr, once per attempt; peerd logs such a refusal itself, one
# line per peer per minute (peerd.daemon.hello). GRPC_VERBOSITY=INFO brings them back.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def attach(model, optimizer, **registered):
    """Join this script's peerd job (peerd.peer.attach; imported on use, so
    that `import peerd` stays light for the daemon, which never imports torch)."""
    from peerd.peer import attach as _attach

    return _attach(model, optimizer, **registered)


def total_steps(dataset, batch_size=None, epochs=None) -> int:
    """The steps a per-batch scheduler must allow for this job (peerd.peer.total_steps;
    callable before attach, so that the scheduler handed to it can be made with it)."""
    from peerd.peer import total_steps as _total_steps

    return _total_steps(dataset, batch_size, epochs)
