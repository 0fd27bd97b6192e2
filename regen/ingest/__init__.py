"""Ingest: the dataset read faithfully, the audit and its gates, decontamination, prompt shards."""
