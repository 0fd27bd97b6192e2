"""regen: regenerate chat completions with SGLang as training data for speculative-decoding drafters."""

__version__ = "0.1.0"
