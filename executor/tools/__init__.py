"""Tools around hotswap: the event generator behind `hotswap generate` and the demo."""
