"""float32 data, GPyTorch's default, is safe: the samplers evaluate the prior and factorise in their ``linalg_dtype``
(float64 unless lowered) whatever the data's dtype, return draws in the data's dtype, ``predict`` works in float32,
and a linear-algebra failure that still happens reaches the user as the package's
:class:`~gpytorch_augment.core.FactorizationError` (a ``ValueError`` with advice), never as linear_operator's raw
``NotPSDError`` / ``NanError``."""

from __future__ import annotations

import copy
import warnings

import gpytorch
import pytest
import torch
from linear_operator.utils.errors import NanError, NotPSDError

from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior, HMCSampler, posterior_sampler
from gpytorch_augment.core import FactorizationError, PriorFactorizationError, prior_cholesky


def _line(n=200, dtype=torch.float32):
    """200 points on a line, default ScaleKernel(RBFKernel()): in float32 its kernel matrix is not positive definite
    even with GPyTorch's jitter."""
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-3, 3, n, dtype=dtype).unsqueeze(-1)
    y = (torch.sin(2 * x.squeeze(-1)) + 0.3 * torch.randn(n, generator=g, dtype=dtype) > 0).to(dtype)
    prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()))
    return prior.to(dtype), x, y


def test_the_float32_kernel_matrix_is_not_positive_definite_in_float32():
    """The premise of the tests below: the kernel matrix evaluated in float32 is not positive definite: its spectrum
    reaches below -1e-6 (about -2e-6 here; a margin of 2 against the float64 jitter), and in float32 it has no
    Cholesky factor even with GPyTorch's float32 jitter added."""
    prior, x, _ = _line()
    with torch.no_grad():
        K = prior.forward(x).covariance_matrix
    assert K.dtype == torch.float32
    assert float(torch.linalg.eigvalsh(K.double()).min()) < -1e-6
    jitter = gpytorch.settings.cholesky_jitter.value(torch.float32)
    assert int(torch.linalg.cholesky_ex(K + jitter * torch.eye(len(x))).info) > 0


@pytest.mark.parametrize("method", ["auto", "gibbs", "hmc"])
def test_float32_reproduction_samples_and_predicts(method):
    prior, x, y = _line()
    sampler = posterior_sampler(prior, BernoulliLogitLikelihood(), x, y, method=method)
    assert sampler.target.terms.L.dtype == torch.float64
    samples = sampler.sample(20, warmup=20, num_chains=2, seed=0, progress=False)
    assert samples.f.dtype == torch.float32 and bool(torch.isfinite(samples.f).all())
    assert samples.last_state().f.dtype == torch.float32
    x_new = torch.linspace(-3, 3, 300).unsqueeze(-1)
    for joint in (True, False):
        pred = samples.predict(x_new, joint=joint)
        assert pred.f_mean.dtype == pred.f_draws.dtype == pred.y_probs.dtype == torch.float32
        assert bool(((pred.y_probs >= 0) & (pred.y_probs <= 1)).all()) and bool(torch.isfinite(pred.f_draws).all())
    more = sampler.resume(samples, 5, progress=False)
    assert more.f.dtype == torch.float32 and more.f.shape == (2, 25, 200)
    assert all(p.dtype == torch.float32 for p in prior.parameters())  # the model is not modified


def test_float32_inducing_point_sampler():
    prior, x, y = _line()
    sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x, y, inducing_points=x[::5].clone())
    samples = sampler.sample(10, warmup=10, num_chains=2, seed=0, progress=False)
    assert samples.f.dtype == samples.u.dtype == torch.float32
    assert samples.predict(x[:7] + 0.01).y_probs.dtype == torch.float32


@pytest.mark.parametrize("cls", [GibbsSampler, HMCSampler])
def test_float32_prior_is_the_float64_prior(cls):
    """The prior is evaluated in float64 from the float32 parameters and inputs: exactly the float64 model's."""
    prior, x, y = _line()
    s32 = cls(prior, BernoulliLogitLikelihood(), x, y)
    s64 = cls(copy.deepcopy(prior).double(), BernoulliLogitLikelihood(), x.double(), y.double())
    assert torch.equal(s32.target.terms.K, s64.target.terms.K) and torch.equal(s32.target.terms.L, s64.target.terms.L)


def test_linalg_dtype_lowers_the_precision():
    prior, x, y = _line(n=30)
    sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x, y, linalg_dtype=torch.float32)
    assert sampler.target.terms.L.dtype == torch.float32
    samples = sampler.sample(5, warmup=5, num_chains=2, seed=0, progress=False)
    assert samples.f.dtype == torch.float32
    hmc = HMCSampler(prior, BernoulliLogitLikelihood(), x, y, linalg_dtype=torch.float32)
    assert hmc.sample(5, warmup=5, num_chains=2, seed=0, progress=False).f.dtype == torch.float32
    assert hmc.target.terms.L.dtype == torch.float32


def test_float64_data_with_a_float32_model_evaluates_in_float64():
    prior, x, y = _line(n=40)
    sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x.double(), y.double())
    reference = GibbsSampler(copy.deepcopy(prior).double(), BernoulliLogitLikelihood(), x.double(), y.double())
    assert torch.equal(sampler.target.terms.K, reference.target.terms.K)


def test_nan_hyper_parameter_is_a_package_error():
    prior, x, y = _line(n=20)
    with torch.no_grad():
        prior.covar_module.base_kernel.raw_lengthscale.fill_(float("nan"))
    with pytest.raises(PriorFactorizationError) as info:
        GibbsSampler(prior, BernoulliLogitLikelihood(), x, y)
    assert isinstance(info.value, ValueError)


def test_failed_prior_factorisation_of_a_graph_raises_without_a_warning():
    # during a hyper-parameter fit K carries a graph: the error message's float() of it must not warn
    K = -torch.eye(3, dtype=torch.float64).requires_grad_(True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*requires_grad.*")
        with pytest.raises(PriorFactorizationError, match="not positive definite"):
            prior_cholesky(K)


def test_failed_joint_prediction_advises_joint_false(monkeypatch):
    import gpytorch_augment.inference.mcmc.samples as samples_module

    prior, x, y = _line(n=20)
    samples = GibbsSampler(prior, BernoulliLogitLikelihood(), x, y).sample(5, warmup=5, seed=0, progress=False)

    def fail(*args, **kwargs):
        raise NotPSDError("not PSD")

    monkeypatch.setattr(samples_module, "psd_safe_cholesky", fail)
    with pytest.raises(FactorizationError, match="joint=False") as info:
        samples.predict(x[:4])
    assert isinstance(info.value, ValueError)
    assert samples.predict(x[:4], joint=False).y_probs.shape == (4,)  # the probabilities never need it


@pytest.mark.parametrize("error", [NotPSDError, NanError])
def test_failed_sweep_factorisation_is_a_package_error(monkeypatch, error):
    import gpytorch_augment.inference.gibbs.kernel as kernel_module

    prior, x, y = _line(n=20)
    sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x, y)

    def fail(*args, **kwargs):
        raise error("raw")

    monkeypatch.setattr(kernel_module.GibbsKernel, "_cholesky_", staticmethod(lambda mat: None))
    monkeypatch.setattr(kernel_module, "psd_safe_cholesky", fail)
    with pytest.raises(FactorizationError, match="sampling failed"):
        sampler.sample(3, warmup=0, seed=0, progress=False)
    with pytest.raises(FactorizationError):
        sampler.sweep(torch.zeros(2, 20))


def test_failed_hmc_preconditioner_is_a_package_error(monkeypatch):
    prior, x, y = _line(n=20)
    sampler = HMCSampler(prior, BernoulliLogitLikelihood(), x, y)

    def fail(*args, **kwargs):
        raise torch.linalg.LinAlgError("raw")

    monkeypatch.setattr(torch.linalg, "cholesky", fail)
    with pytest.raises(FactorizationError, match="preconditioner"):
        sampler.sample(3, warmup=0, seed=0, progress=False)
