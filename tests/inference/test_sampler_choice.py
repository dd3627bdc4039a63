"""Tests of :func:`~gpytorch_augment.posterior_sampler`: ``method="auto"`` follows the one declared rule (Gibbs where
only it applies, else the likelihood's measured ``preferred_sampler``, or ``preferred_hyper_sampler`` when the
hyper-parameters are sampled too), a named kernel is built as named, and bad
choices fail with a ``ValueError`` naming the argument."""

from __future__ import annotations

import gpytorch
import pytest
import torch

from gpytorch_augment import (
    BernoulliLogitLikelihood,
    GibbsSampler,
    GPPrior,
    HeteroscedasticGaussianLikelihood,
    HMCSampler,
    LaplaceLikelihood,
    LogisticSoftmaxLikelihood,
    PoissonLogitLikelihood,
    StudentTLikelihood,
    posterior_sampler,
)
from gpytorch_augment.inference.sampler_choice import METHODS, choose_method
from tests.likelihoods.registry import CASES

X = torch.linspace(-2, 2, 8, dtype=torch.float64).unsqueeze(-1)


def _prior():
    return GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel()).double()


def test_auto_builds_the_preferred_sampler():
    binary = (X.squeeze(-1) > 0).double()
    assert type(posterior_sampler(_prior(), BernoulliLogitLikelihood(), X, binary)) is HMCSampler
    assert type(posterior_sampler(_prior(), StudentTLikelihood(df=4.0), X, X.squeeze(-1))) is HMCSampler
    counts = torch.arange(8, dtype=torch.float64) % 4
    assert type(posterior_sampler(_prior(), PoissonLogitLikelihood(), X, counts)) is HMCSampler
    assert type(posterior_sampler(_prior(), LaplaceLikelihood(scale=0.3), X, X.squeeze(-1))) is GibbsSampler
    labels = torch.arange(8, dtype=torch.float64) % 3
    assert type(posterior_sampler(_prior(), LogisticSoftmaxLikelihood(3), X, labels)) is HMCSampler
    assert type(posterior_sampler(_prior(), HeteroscedasticGaussianLikelihood(), X, X.squeeze(-1))) is HMCSampler


def test_auto_falls_back_to_gibbs_where_only_gibbs_applies():
    labels = torch.arange(8, dtype=torch.float64) % 3
    with_prior = LogisticSoftmaxLikelihood(3, learn_class_scales=True, class_scale_prior=(2.0, 2.0))
    assert with_prior.samples_constants and not LogisticSoftmaxLikelihood(3).samples_constants
    assert type(posterior_sampler(_prior(), with_prior, X, labels)) is GibbsSampler
    assert PoissonLogitLikelihood(rate_scale_prior=(2.0, 1.0)).samples_constants
    sparse = posterior_sampler(_prior(), BernoulliLogitLikelihood(), X, (X.squeeze(-1) > 0).double(),
                               inducing_points=X[::2].clone())
    assert type(sparse) is GibbsSampler and sparse.target.inducing_points is not None


def test_named_kernel_and_options():
    y = (X.squeeze(-1) > 0).double()
    gibbs = posterior_sampler(_prior(), BernoulliLogitLikelihood(), X, y, method="gibbs", overrelaxation=-0.5)
    assert type(gibbs) is GibbsSampler and gibbs.kernel.overrelaxation == -0.5
    hmc = posterior_sampler(_prior(), PoissonLogitLikelihood(), X, X.squeeze(-1).abs().round(), method="hmc",
                            num_steps=(2, 3))
    assert type(hmc) is HMCSampler and hmc.kernel.num_steps == (2, 3)
    samples = hmc.sample(5, warmup=5, num_chains=2, seed=0, progress=False)
    assert samples.f.shape == (2, 5, 8) and torch.isfinite(samples.f).all()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_likelihood_declares_a_known_sampler(case):
    assert choose_method(case.make()) in METHODS
    assert choose_method(case.make(), sample_hyperparameters=True) in METHODS


def test_auto_with_sampled_hyperparameters_reads_the_hyper_preference():
    """``sample_hyperparameters=True``: the joint HMC sampler for the logistic-softmax likelihood (its declared
    ``preferred_hyper_sampler``), the Gibbs sampler for the binary one and wherever only Gibbs applies."""
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    prior = GPPrior(gpytorch.means.ZeroMean(), kernel).double()
    labels = torch.arange(8, dtype=torch.float64) % 3
    multi = posterior_sampler(prior, LogisticSoftmaxLikelihood(3), X, labels, sample_hyperparameters=True)
    assert type(multi) is HMCSampler and multi.kernel.name == "hyper_hmc"
    binary = posterior_sampler(prior, BernoulliLogitLikelihood(), X, (X.squeeze(-1) > 0).double(),
                               sample_hyperparameters=True)  # fmt: skip
    assert type(binary) is GibbsSampler and binary.kernel.name == "hyper"
    with_prior = LogisticSoftmaxLikelihood(3, learn_class_scales=True, class_scale_prior=(2.0, 2.0))
    assert type(posterior_sampler(prior, with_prior, X, labels, sample_hyperparameters=True)) is GibbsSampler
    sparse = posterior_sampler(prior, LogisticSoftmaxLikelihood(3), X, labels, sample_hyperparameters=True,
                               inducing_points=X[::2].clone())  # fmt: skip
    assert type(sparse) is GibbsSampler


def test_bad_choices_raise():
    y = (X.squeeze(-1) > 0).double()
    with pytest.raises(ValueError, match="method"):
        posterior_sampler(_prior(), BernoulliLogitLikelihood(), X, y, method="nuts")
    with pytest.raises(ValueError, match="overrelaxation"):
        posterior_sampler(_prior(), BernoulliLogitLikelihood(), X, y, overrelaxation=-0.5)  # auto -> HMC
    labels = torch.arange(8, dtype=torch.float64) % 3
    with_prior = LogisticSoftmaxLikelihood(3, learn_class_scales=True, class_scale_prior=(2.0, 2.0))
    with pytest.raises(ValueError, match="prior on its constants"):
        HMCSampler(_prior(), with_prior, X, labels)
    with pytest.raises(ValueError, match="exact posterior"):
        posterior_sampler(_prior(), BernoulliLogitLikelihood(), X, y, method="hmc", inducing_points=X[::2].clone())

    class Odd(BernoulliLogitLikelihood):
        preferred_sampler = "nuts"

    with pytest.raises(ValueError, match="preferred_sampler"):
        posterior_sampler(_prior(), Odd(), X, y)

    class OddHyper(BernoulliLogitLikelihood):
        preferred_hyper_sampler = "nuts"

    with pytest.raises(ValueError, match="preferred_hyper_sampler"):
        posterior_sampler(_prior(), OddHyper(), X, y, sample_hyperparameters=True)
