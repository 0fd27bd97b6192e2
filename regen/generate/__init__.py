"""Generate: one shard's job, the client, the request journal, lending, the replay preview."""
