"""The data plane: one worker process per job, supervised by the daemon."""
