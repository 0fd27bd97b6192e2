"""Tune: planning a server for the workload, the live sweep, the run projection."""
