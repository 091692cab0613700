"""`python -m hotswap` is the `hotswap` command."""

from hotswap.executor.operator.cli import main

main()
