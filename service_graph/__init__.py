"""The permanent routing query: reads the user source, assigns windows, routes rows to the
execution graph that owns their window, and takes the cut when a swap asks for one."""
