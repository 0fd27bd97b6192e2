"""Serving: the life of inference servers (slots, ports, /proc, probes, readiness, the supervisor, progress
and metrics), one module per ``server.mode`` behind :class:`regen.serving.base.ServerMode`.

``regen.serving.lifecycle.acquire_server`` is the entry point that starts a job's server
(``regen.tune.prestart`` starts the same slot supervisors while a local run's data is prepared);
SGLang's own rules (memory plan, flags, realized numbers) stay in ``regen.sglang``.
"""
