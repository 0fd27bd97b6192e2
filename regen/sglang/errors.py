"""The planner's refusals: flags or inputs it cannot turn into a memory plan."""

from __future__ import annotations


class PlanError(ValueError):
    """Flags or inputs the planner cannot turn into a memory plan."""


class UnmodelledError(PlanError):
    """A model whose pools the planner does not model: SGLang's own planning applies (no memory flags)."""
