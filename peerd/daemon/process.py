"""What every worker process the daemon starts has in common."""

RELAY_LINE_LIMIT = 1 << 20  # the longest output line relayed whole from a worker
