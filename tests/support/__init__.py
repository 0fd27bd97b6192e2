"""Test support: harnesses the tests, the benches and maintainers run; not part of the regen package.

- ``soak.py``: the kill-anywhere soak (``python tests/support/soak.py --rounds 20``;
  ``tests/test_kill_anywhere.py`` runs a short one; ``bench/efficiency.py`` and ``bench/scale.py`` copy the
  workflow with it).
- ``demo_assets.py``: rebuilds the committed demo tokenizer (``resources/demo-tokenizer``) and datasets
  (``data/demo/``) from fixed seeds; ``tests/test_dataset.py`` checks a rebuild matches what is shipped.
- ``readme_trainer_section.py``: writes the README's trainer settings from the demo's export manifest
  (``tests/test_trainers.py`` checks them).
- ``demo_equivalence.py``: digests the demo run of a git revision and compares two digests (proof that a
  refactor left the demo's results unchanged).

Tests import these as ``support.<module>`` (``tests/`` is on ``sys.path``: it is no package); benches put
``tests/`` on ``sys.path`` first. Nothing under ``regen/``, ``scripts/`` or ``rules/`` imports them.
"""
