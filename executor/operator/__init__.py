"""The operator surface: the `hotswap` command line and the client it drives."""
