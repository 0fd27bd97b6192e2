"""The ``features`` stage: the target's hidden states over the token export's ids, for offline drafter
training (issue 59). ``config`` (the section, layer conventions), ``projection`` (bytes and GPU-hours before
anything runs), ``rows`` (which rows), ``store`` (safetensors per row, the shard manifest, resume),
``backends`` (transformers, SGLang), ``compute`` (one shard's job), ``export`` (the trainers' layouts).
Only ``backends``, ``store`` writes and ``export`` need torch, imported where they run."""
