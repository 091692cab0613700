"""Output and progress: forwards each execution graph's results to the user sink and reports
the graph's committed progress to the executor through Redis."""
