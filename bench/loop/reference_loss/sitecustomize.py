"""``train --reference-loss``: SpecForge's Triton loss swapped for its reference formula, nothing else.

This directory goes first on the ``specforge train`` subprocess's PYTHONPATH (its workers and data
loader processes inherit it), so Python imports this file at startup (``site``: ``sitecustomize``). It
puts a finder on ``sys.meta_path`` that answers one module, ``specforge.core.loss``, with
``specforge_loss.py`` beside it; every other import is untouched. The swap is named in train.log.
"""

import importlib.util
import sys
from pathlib import Path

_REPLACED = "specforge.core.loss"
_WITH = Path(__file__).with_name("specforge_loss.py")


class _ReferenceLossFinder:
    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname != _REPLACED:
            return None
        return importlib.util.spec_from_file_location(fullname, _WITH)


sys.meta_path.insert(0, _ReferenceLossFinder())
