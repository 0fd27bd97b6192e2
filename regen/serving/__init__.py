"""Serving: the life of inference servers (slots, ports, /proc, probes, readiness, the supervisor, progress
and metrics), one module per ``server.mode`` behind :class:`regen.serving.base.ServerMode`.

``regen.serving.lifecycle.acquire_server`` is the only entry point that starts servers; SGLang's own
rules (memory plan, flags, realized numbers) stay in ``regen.sglang``.
"""
