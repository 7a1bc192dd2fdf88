"""peerd: decentralised, elastic training for labs full of mismatched GPU machines."""

__version__ = "0.1.0"


def attach(model, optimizer, **registered):
    """Join this script's peerd job (peerd.peer.attach; imported on use, so
    that `import peerd` stays light for the daemon, which never imports torch)."""
    from peerd.peer import attach as _attach

    return _attach(model, optimizer, **registered)
