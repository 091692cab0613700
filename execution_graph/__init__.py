"""User queries: load them, validate them, and run each as a Spark streaming query that reads
its own input topic (the buffer the service graph fills)."""
