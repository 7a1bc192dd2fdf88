"""The daemon's contract with its local processes: the control client, JSON replies, progress, a worker's launch, lifeline and rendezvous."""
