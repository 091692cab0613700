"""The control plane: the swap state machine, the journal client, the lease and the graph lifecycle."""
