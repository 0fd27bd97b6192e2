"""Stands in for ``specforge.core.loss`` (SpecForge 0.2.0) under ``train --reference-loss`` (CPU: no Triton).

``LogSoftmaxLoss.apply(logits, target, position_mask)`` returns what SpecForge's Triton kernel returns,
from SpecForge's own reference formula (``specforge.core.loss._compute_loss``, written out without its
``torch.compile``): per token ``-sum(target * log_softmax(logits))`` where ``position_mask`` is set, 0
elsewhere, averaged over every (batch, position). Autograd makes the gradient the kernel's hand-written
backward computes.
"""

import torch
import torch.nn as nn

REFERENCE_LOSS = True


def _compute_loss(logits, target_p, position_mask):
    logits = logits.float()
    out_logp = nn.LogSoftmax(dim=2)(logits)
    plogp = target_p * out_logp
    return -torch.sum(position_mask * plogp, 2).mean()


class LogSoftmaxLoss:
    @staticmethod
    def apply(logits, target, position_mask):
        return _compute_loss(logits, target, position_mask)
