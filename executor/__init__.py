"""The control plane: CLI, embedded stack, the executor's state machine and the swap protocol."""
