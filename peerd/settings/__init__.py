"""Settings: the daemon's config file and the job file, read into frozen values."""
