"""`python -m executor` is the `hotswap` command."""

from executor.cli import main

main()
