"""The drafter loop (issue 36): regen's exports -> features -> ``specforge train`` -> served acceptance.

A bench, not product: nothing under ``regen/`` imports it. Each module is its own ``python -m`` step run
under the trainers' python (``prepare``, ``capture``, ``train``: loop-train; ``accept``, ``sequence``,
``report``: loop-serve).
"""
