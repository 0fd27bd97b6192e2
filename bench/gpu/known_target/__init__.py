"""The known-answer target campaign (issues 27, 36, 37): one entry, ``python -m bench.gpu.known_target STEP``.

- ``model``: the target, a Markov chain written into real weights (hybrid Qwen3.6-27B shape or ``--dense``).
- ``check``: the built checkpoint through transformers' own code (the trainers' venv; needs torch).
- ``run``: regen's whole workflow on it, measured against the design: the ``target:`` line.
- ``baselines``: the same prompts through SGLang's defaults or the original run's flags.
- ``device``: the sequence on a GPU host through the device tool (``start``, ``wait``).
"""
