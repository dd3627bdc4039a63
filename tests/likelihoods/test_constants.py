"""Bad input at the likelihoods' and distributions' entry points: a ``ValueError`` naming the argument, never a hang,
NaN or a raw torch error; constants' shapes follow ``batch_shape`` whatever the initial value; the heteroscedastic
predictive quantiles agree with Monte Carlo."""

from __future__ import annotations

import math

import pytest
import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal

from gpytorch_augment import (
    AugmentedELBO,
    BernoulliLogitLikelihood,
    HeteroscedasticGaussianLikelihood,
    HeteroscedasticStudentTLikelihood,
    LaplaceLikelihood,
    LogisticSoftmaxLikelihood,
    NegativeBinomialLogitLikelihood,
    PoissonLogitLikelihood,
    StudentTLikelihood,
)
from gpytorch_augment.distributions import PolyaGamma
from gpytorch_augment.testing import SVGP
from tests.likelihoods.registry import PRIMARY

#: (likelihood class, constant, constructor kwargs of a default instance): each primary case's ``constants``
CONSTANTS = [
    (type(case.make()), name, dict(case.constructor_kwargs)) for case in PRIMARY for name in case.constants
]
BAD_VALUES = [0.0, -1.0, math.inf, -math.inf, math.nan, 1e400, torch.tensor(0.0), torch.tensor([-2.0]), "1", None]
#: (likelihood class, prior argument, constructor kwargs it needs): each primary case's ``constant_priors``
PRIORS = [
    (type(case.make()), name, {**case.constructor_kwargs, **needs})
    for case in PRIMARY
    for name, needs in case.constant_priors.items()
]
#: the constants of shape ``(*batch_shape, 1)`` (one value per batch; not the per-class ``class_scales``)
PER_BATCH = [
    (cls, name, kwargs) for cls, name, kwargs in CONSTANTS if getattr(cls(**kwargs), f"raw_{name}").shape == (1,)
]
BAD_PRIORS = [(math.inf, 1.0), (1.0, math.inf), (0.0, 1.0), (1.0, -1.0), (math.nan, 1.0), "ab", (1.0,)]


def _ids(cases):
    return [f"{cls.__name__}.{name}" for cls, name, _ in cases]


@pytest.mark.parametrize("value", BAD_VALUES, ids=repr)
@pytest.mark.parametrize(("cls", "name", "kwargs"), CONSTANTS, ids=_ids(CONSTANTS))
def test_bad_constant_is_rejected_by_constructor_and_setter(cls, name, kwargs, value):
    with pytest.raises(ValueError, match=name):
        cls(**{**kwargs, name: value})
    likelihood = cls(**kwargs)
    before = getattr(likelihood, name).detach().clone()
    with pytest.raises(ValueError, match=name):
        setattr(likelihood, name, value)
    assert torch.equal(getattr(likelihood, name).detach(), before)  # unchanged after a rejected value


@pytest.mark.parametrize("prior", BAD_PRIORS, ids=repr)
@pytest.mark.parametrize(("cls", "name", "kwargs"), PRIORS, ids=_ids(PRIORS))
def test_bad_prior_is_rejected(cls, name, kwargs, prior):
    with pytest.raises(ValueError, match=name):
        cls(**kwargs, **{name: prior})


@pytest.mark.parametrize("batch_shape", [(), (2,), (2, 3)])
@pytest.mark.parametrize(("cls", "name", "kwargs"), PER_BATCH, ids=_ids(PER_BATCH))
def test_constant_shape_follows_batch_shape_not_the_initial_value(cls, name, kwargs, batch_shape):
    shapes = set()
    for value in (2.0, 2, torch.tensor(2.0), torch.tensor([2.0]), torch.full((*batch_shape, 1), 2.0)):
        likelihood = cls(**{**kwargs, name: value}, batch_shape=torch.Size(batch_shape))
        shapes.add(tuple(getattr(likelihood, f"raw_{name}").shape))
        assert torch.allclose(getattr(likelihood, name), torch.tensor(2.0))
    assert shapes == {(*batch_shape, 1)}
    with pytest.raises(ValueError, match=name):
        cls(**{**kwargs, name: torch.ones(5, 4)}, batch_shape=torch.Size(batch_shape))


def test_class_scales_shape():
    for value in (2.0, torch.tensor(2.0), [2.0, 2.0, 2.0], torch.full((3,), 2.0)):
        assert LogisticSoftmaxLikelihood(3, class_scales=value).raw_class_scales.shape == (3,)


def test_per_chain_values_are_still_accepted_after_construction():
    likelihood = HeteroscedasticGaussianLikelihood()
    likelihood.max_precision = torch.tensor([[1.0], [2.0]])
    assert likelihood.max_precision.shape == (2, 1)
    likelihood.max_precision = 3.0  # back to the declared shape
    assert likelihood.raw_max_precision.shape == (1,)


def test_float32_overflow_of_a_value_names_the_constant_and_float64():
    likelihood = PoissonLogitLikelihood().float()
    with pytest.raises(ValueError, match="rate_scale.*float32.*float64"):
        likelihood.rate_scale = 1e39
    likelihood.double().rate_scale = 1e39
    assert torch.isfinite(likelihood.rate_scale).all()


def test_a_closed_form_update_is_written_unchecked_and_its_overflow_shows_in_the_next_elbo():
    """The rule: a closed-form update runs inside every CAVI step and is not checked (that would read its value back
    from the device at every step); an overflow makes the next ELBO non-finite, which ``CAVI.fit`` reports."""
    likelihood = PoissonLogitLikelihood().float()
    y, m, s = (torch.tensor(v, dtype=torch.float32) for v in ([3.0, 4.0], [-200.0, -200.0], [1e-6, 1e-6]))
    likelihood.update_hyperparameters(y, None, m, s)
    assert not torch.isfinite(likelihood.rate_scale).all()
    m, s = torch.zeros(2), torch.ones(2)
    assert not torch.isfinite(likelihood.elbo_terms(y, likelihood.aux_posterior(y, m, s), m, s)).any()


# ---------------------------------------------------------------------- q(f) entry points
def _q_f(n: int, mean: float = 0.0, var: float = 1.0) -> MultivariateNormal:
    return MultivariateNormal(torch.full((n,), mean), var * torch.eye(n))


@pytest.mark.parametrize("cls", [LaplaceLikelihood, StudentTLikelihood])
@pytest.mark.parametrize("member", ["expected_log_prob", "log_marginal"])
def test_robust_likelihoods_validate_observations(cls, member):
    likelihood = cls()
    with pytest.raises(ValueError, match="targets y have shape"):
        getattr(likelihood, member)(torch.zeros(3), _q_f(4))
    bad = MultivariateNormal(torch.tensor([0.0, math.nan]), torch.eye(2))
    with pytest.raises(ValueError, match="non-finite mean or variance"):
        getattr(likelihood, member)(torch.zeros(2), bad)
    with pytest.raises(ValueError, match="non-finite"):
        getattr(likelihood, member)(torch.tensor([0.0, math.inf]), _q_f(2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cls", [PoissonLogitLikelihood, NegativeBinomialLogitLikelihood, LaplaceLikelihood,
                                 StudentTLikelihood, BernoulliLogitLikelihood])
def test_single_latent_entry_points_are_finite_at_extremes(cls, dtype):
    likelihood = cls().to(dtype)
    y = torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=dtype)
    for mean, var in ((1e3, 1e-3), (-1e3, 1e-3), (0.0, 1e6), (30.0, 1e-8)):
        q = MultivariateNormal(torch.full((4,), mean, dtype=dtype), var * torch.eye(4, dtype=dtype))
        m, s = q.mean, q.variance
        assert torch.isfinite(likelihood.expected_log_prob(y, q)).all(), (mean, var)
        q_aux = likelihood.aux_posterior(y, m, s)
        assert torch.isfinite(likelihood.elbo_terms(y, q_aux, m, s)).all(), (mean, var)


# ---------------------------------------------------------------------- distributions and the MLL
@pytest.mark.parametrize(("b", "c", "name"), [(1.0, math.inf, "c"), (math.inf, 1.0, "b"), (-1.0, 0.0, "b"),
                                              (math.nan, 0.0, "b"), (1.0, math.nan, "c")])
def test_polya_gamma_rejects_non_finite_parameters(b, c, name):
    with pytest.raises(ValueError, match=f"{name} must be finite"):
        PolyaGamma(b, c)


@pytest.mark.parametrize(("b", "c"), [(1.0, 1e300), (1.0, 1e60), (1e300, 0.0), (3.0, 1e9), (0.5, 1e20)])
def test_polya_gamma_extreme_parameters_sample_fast_and_right(b, c):
    q = PolyaGamma(torch.tensor(b, dtype=torch.float64), torch.tensor(c, dtype=torch.float64))
    draws = q.sample((200,), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(draws).all() and (draws > 0).all()
    assert float(draws.mean() / q.mean) == pytest.approx(1.0, rel=1e-2)


@pytest.mark.parametrize("num_data", [0, -3, 2.5, "10", True, None])
def test_augmented_elbo_rejects_bad_num_data(num_data):
    with pytest.raises(ValueError, match="num_data"):
        AugmentedELBO(BernoulliLogitLikelihood(), SVGP(torch.zeros(2, 1)), num_data=num_data)


# ---------------------------------------------------------------------- predictive quantiles
@pytest.mark.parametrize("cls", [HeteroscedasticGaussianLikelihood, HeteroscedasticStudentTLikelihood])
def test_predictive_interval_matches_monte_carlo(cls):
    g = torch.Generator().manual_seed(0)
    likelihood = cls(max_precision=3.0).double()
    mean = torch.randn(4, 2, generator=g, dtype=torch.float64)
    q = MultitaskMultivariateNormal(mean, torch.diag(torch.rand(8, generator=g, dtype=torch.float64) + 0.1))
    lower, upper = likelihood.predictive_interval(q, level=0.8)
    torch.manual_seed(1)
    y = likelihood.forward(q.sample(torch.Size([100000]))).sample()
    coverage = ((y > lower) & (y < upper)).double().mean(0)
    assert torch.allclose(coverage, torch.full_like(coverage, 0.8), atol=6e-3)
    below = (y < likelihood.predictive_quantile(q, 0.25)).double().mean(0)
    assert torch.allclose(below, torch.full_like(below, 0.25), atol=6e-3)
    with pytest.raises(ValueError, match="level"):
        likelihood.predictive_interval(q, level=1.0)
