"""One gossip round: its context, the dispatcher and the round functions (flat, pair, hierarchical), overlapped rounds."""
