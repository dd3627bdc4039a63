"""A fit's state lives in the engine, not on the likelihood: CAVI keeps the last q(Ω) as ``cavi.q_aux``; a
likelihood holds only its model (its constants), so one likelihood can serve several engines at once."""

from __future__ import annotations

import torch

from gpytorch_augment import CAVI, BernoulliLogitLikelihood
from gpytorch_augment.testing import make_cavi_model


def test_cavi_keeps_q_aux_and_the_likelihood_holds_no_fit_state():
    generator = torch.Generator().manual_seed(3)
    x = torch.rand(40, 1, generator=generator, dtype=torch.float64)
    y = (torch.sin(6 * x.squeeze(-1)) > 0).double()
    likelihood = BernoulliLogitLikelihood().double()
    models = [make_cavi_model(1, x[:8].clone()).double() for _ in range(2)]
    engines = [CAVI(model, likelihood, num_data=40) for model in models]
    assert engines[0].q_aux is None
    engines[0].step(x, y)
    engines[1].step(x[:20], y[:20])
    assert engines[0].q_aux["c"].shape == (40,) and engines[1].q_aux["c"].shape == (20,)
    assert torch.isfinite(engines[0].q_aux["c"]).all()
    assert not hasattr(likelihood, "q_aux") and not hasattr(likelihood, "aux")
