"""Test support: harnesses the tests, the benches and maintainers run; not part of the regen package.

- ``soak.py``: the kill-anywhere soak (``python tests/support/soak.py --rounds 20``;
  ``tests/workflow/test_kill_anywhere.py`` runs a short one; ``bench/efficiency.py`` and
  ``bench/scale.py`` copy the workflow with it).
- ``demo_assets.py``: rebuilds the committed demo tokenizer (``resources/demo-tokenizer``) and datasets
  (``data/demo/``) from fixed seeds; ``tests/ingest/test_dataset.py`` checks a rebuild matches what is
  shipped.
- ``readme_trainer_section.py``: writes the README's trainer settings from the demo's export manifest
  (``tests/output/test_trainers.py`` checks them).
- ``demo_equivalence.py``: digests the demo run of a git revision and compares two digests (proof that a
  refactor left the demo's results unchanged).
- ``workflow.py``: a copy of the checkout's workflow in a fresh directory and Snakemake run there (the
  workflow tests, and the tests elsewhere that end with a real demo run).
- ``valid_shards.py``: valid shards from hand-built generation records (merge, stage progress).
- ``known_target.py``: the known-answer targets' checkpoint checked by transformers' own code (both
  ``tests/bench/test_known_target*.py``).

Tests import these as ``support.<module>`` (``tests/`` is on ``sys.path``: it is no package, nor are
its folders ``tests/<package>/``, which mirror regen's); benches put
``tests/`` on ``sys.path`` first. Nothing under ``regen/``, ``scripts/`` or ``rules/`` imports them.
"""
