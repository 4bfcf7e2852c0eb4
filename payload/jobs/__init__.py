"""The worker's own job control: the job agent, the run lock and recorded process groups."""
