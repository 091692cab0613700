"""Tools around hotswap: the demo and the event generator it runs."""
