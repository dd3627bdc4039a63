"""GPPrior, the exact prior for the samplers, and the ExactGP trap made loud."""

from __future__ import annotations

import gpytorch
import pytest
import torch

from gpytorch_augment import CAVI, BernoulliLogitLikelihood, GibbsSampler, GPPrior, HeteroscedasticGaussianLikelihood
from tests.models import SVGP

N = 10


def _data():
    x = torch.linspace(-2, 2, N).unsqueeze(-1)
    return x, (x.squeeze(-1) > 0).double()


def _prior(batch_shape=torch.Size()):
    return GPPrior(
        gpytorch.means.ZeroMean(batch_shape=batch_shape),
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch_shape), batch_shape=batch_shape),
    )


def test_gp_prior_is_the_prior_and_refuses_posterior_calls():
    x, _ = _data()
    prior = _prior()
    assert torch.equal(prior(x).mean, prior.forward(x).mean)  # train mode: the prior
    prior.eval()
    with pytest.raises(RuntimeError, match="samples.predict"):
        prior(x)
    with pytest.raises(TypeError, match="mean_module"):
        GPPrior(gpytorch.kernels.RBFKernel(), gpytorch.kernels.RBFKernel())


def test_sampler_with_gp_prior_matches_an_exact_gp_model_and_only_the_exact_gp_warns():
    x, y = _data()

    class Exact(gpytorch.models.ExactGP):
        def __init__(self, prior):
            super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
            self.mean_module, self.covar_module = prior.mean_module, prior.covar_module

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    prior = _prior()
    a = GibbsSampler(prior, BernoulliLogitLikelihood(), x, y).sample(5, warmup=2, seed=0, progress=False)
    with pytest.warns(UserWarning, match="GPPrior"):
        sampler = GibbsSampler(Exact(prior), BernoulliLogitLikelihood(), x, y)
    b = sampler.sample(5, warmup=2, seed=0, progress=False)
    assert torch.equal(a.f, b.f)


def test_multitask_prediction_layout():
    x, _ = _data()
    y = torch.sin(3 * x.squeeze(-1))
    samples = GibbsSampler(_prior(torch.Size([2])), HeteroscedasticGaussianLikelihood(), x, y).sample(
        4, warmup=2, num_chains=2, seed=0, progress=False
    )
    pred = samples.predict(torch.zeros(3, 1))
    assert pred.f_mean.shape == (2, 3)  # latent-major, as samples.f
    multitask = pred.to_multitask()
    assert multitask.f_mean.shape == (3, 2) and multitask.f_var.shape == (3, 2)
    assert multitask.f_draws.shape == (2, 4, 3, 2)
    assert torch.equal(multitask.f_mean, pred.f_mean.mT)


def test_column_targets_and_unknown_keywords():
    x, y = _data()
    steps = []
    for targets in (y, y.unsqueeze(-1)):
        cavi = CAVI(SVGP(x[::3]), BernoulliLogitLikelihood(), num_data=N)
        steps.append(cavi.step(x, targets))
    assert torch.equal(steps[0], steps[1])
    cavi = CAVI(SVGP(x[::3]), BernoulliLogitLikelihood(), num_data=N)
    with pytest.raises(TypeError, match="learn_hyperparameter"):
        cavi.fit(x, y, learn_hyperparameter=True)
    with pytest.raises(ValueError, match="num_data=20"):
        CAVI(SVGP(x[::3]), BernoulliLogitLikelihood(), num_data=20).fit(x, y)
    with pytest.raises(ValueError, match="N = 0"):
        cavi.step(x[:0], y[:0])
    with pytest.raises(ValueError, match="N = 0"):
        GibbsSampler(_prior(), BernoulliLogitLikelihood(), x[:0], y[:0])
