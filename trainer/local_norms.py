"""Local norms: the gradient norm of each weight (seed 004's "local norm").

A global gradient norm says *that* a step went wrong; the per-weight norms say
*where*: the layer whose norm moves first and most is where a precision
problem or a bad batch enters. They are read after data-parallel averaging and
unscaling and before clipping, so that they are what the optimizer was given.
"""

from __future__ import annotations

from typing import Iterable

import torch


def local_norms(named_parameters: Iterable[tuple[str, torch.nn.Parameter]]) -> dict[str, float]:
    """The L2 norm of each parameter's gradient, by parameter name, in model
    order (the square root of seed 004's sum of squares, so that it adds up
    like the global norm: global = sqrt(sum of squares of these)). A weight
    without a gradient is left out."""
    return {
        name: float(param.grad.detach().float().norm())
        for name, param in named_parameters
        if param.grad is not None
    }
