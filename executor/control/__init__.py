"""The control plane: the swap state machine and its loop, the lease, the graph lifecycle and the Spark session."""
