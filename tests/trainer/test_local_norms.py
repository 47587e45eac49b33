"""Per-weight gradient norms add up to the global norm and name the weight a
gradient entered by."""

from __future__ import annotations

import math

import torch

from trainer.local_norms import local_norms


def test_local_norms_square_sum_to_the_global_norm_and_skip_frozen_weights():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    model[0].bias.requires_grad_(False)
    model(torch.ones(5, 4)).pow(2).sum().backward()
    norms = local_norms(model.named_parameters())
    assert list(norms) == ["0.weight", "1.weight", "1.bias"]
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    global_norm = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])))
    assert math.isclose(math.sqrt(sum(v * v for v in norms.values())), global_norm, rel_tol=1e-6)


def test_a_gradient_that_enters_one_weight_shows_in_that_weight_only():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False), torch.nn.Linear(2, 2, bias=False))
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    model[1].weight.grad[0, 0] = 3.0
    assert local_norms(model.named_parameters()) == {"0.weight": 0.0, "1.weight": 3.0}


def test_the_plans_local_norms_steps_round_trip_through_json():
    from trainer.plan import ResumePlan

    plan = ResumePlan(subrun="1.03", local_norms_steps=(41, 42, 43))
    assert ResumePlan.from_json(plan.to_json()) == plan
    assert ResumePlan.from_dict({"subrun": "1.00"}).local_norms_steps == ()  # plans written before the field
