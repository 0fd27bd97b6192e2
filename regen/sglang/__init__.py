"""SGLang: memory planning, flag checking, server lifecycle and a simulated server."""
