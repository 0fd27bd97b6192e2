"""Output: validation, merge, export, loss masks, re-audit, reconciliation, provenance, publishing."""
