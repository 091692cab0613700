"""`python -m executor` is the `hotswap` command."""

from executor.operator.cli import main

main()
