"""The training loss, shared by the plain step (trainer/steps.py) and the pipeline's
last stage (trainer/parallel/pipeline.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss, in fp32 whatever the compute dtype: the softmax
    of a large vocabulary loses too much in 16 bits."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
