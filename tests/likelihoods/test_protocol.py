r"""The identities every augmented likelihood must pass (docs/maths/identities.md), for every registered case.

The suite itself ships as :mod:`gpytorch_augment.testing`: :class:`TestProtocol` below is its
:class:`~gpytorch_augment.testing.AugmentedLikelihoodTestCase`, parametrised over every case of
:data:`tests.likelihoods.registry.CASES`, so each registered likelihood runs every identity check (``violation_*``:
a ratio ``<= 1`` per component), the shape and dtype checks and GPyTorch's own ``BaseLikelihoodTestCase`` tests.
(g), the Geweke test, runs in ``tests/inference/test_geweke.py``, with the sampler's other Geweke tests.

:class:`TestTwoBitLogitThirdParty` registers the two-latent toy of ``toy_multilatent.py`` the way a third-party
package would (a subclass with ``case = ...``), which also exercises the multi-latent paths. The ``test_detects_*``
tests feed the same checks deliberately broken Bernoulli likelihoods and assert that they fail, so every identity
can fail.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from gpytorch_augment import BernoulliLogitLikelihood
from gpytorch_augment._numerics import LOG2, log_sigma_tilde_plus
from gpytorch_augment.likelihoods import AugmentedLikelihood
from gpytorch_augment.testing import (
    AugmentedLikelihoodTestCase,
    LikelihoodCase,
    gp_data,
    protocol_data,
    violation_aux_conditional,
    violation_bound,
    violation_bound_gp,
    violation_cavi_monotone,
    violation_f_conditional_exact,
    violation_f_conditional_sparse,
    violation_marginalisation,
    violation_stationarity,
    worst,
)
from tests.likelihoods.registry import BERNOULLI, CASES
from tests.likelihoods.toy_multilatent import TWO_BIT_LOGIT


# ================================================================================================ the protocol tests
class TestProtocol(AugmentedLikelihoodTestCase):
    """Every shipped test, for every registered likelihood."""

    #: the Geweke test runs in tests/inference/test_geweke.py (with the over-relaxed and inducing-point variants)
    test_g_geweke = None

    @pytest.fixture(params=CASES, ids=lambda case: case.name)
    def likelihood_case(self, request: pytest.FixtureRequest) -> LikelihoodCase:
        return request.param


class TestTwoBitLogitThirdParty(AugmentedLikelihoodTestCase):
    """The test-only two-latent likelihood, registered through the public API only (as a third party would)."""

    case = TWO_BIT_LOGIT
    #: its Geweke test runs in tests/inference/test_geweke.py (test_geweke_multi_latent_paths, fewer chains)
    test_g_geweke = None


def test_third_party_registration_inherits_every_test():
    """A subclass that only sets ``case`` has every test of the shipped suite, one per identity letter
    (docs/maths/identities.md) plus
    the shape and GPyTorch tests (:class:`TestTwoBitLogitThirdParty` runs them)."""
    names = {n for n, _ in inspect.getmembers(AugmentedLikelihoodTestCase, inspect.isfunction) if n.startswith("test_")}
    letters = {n.split("_")[1] for n in names if len(n.split("_")[1]) == 1}
    assert letters == set("abcdefgh"), letters
    assert {"test_shapes_and_dtypes", "test_gpytorch_base_likelihood"} <= names

    class TestMine(AugmentedLikelihoodTestCase):
        case = TWO_BIT_LOGIT

    assert {n for n in names if callable(getattr(TestMine, n))} == names
    TestMine().test_c_deterministic_marginalisation(TWO_BIT_LOGIT)  # a test body runs on the subclass's case


def test_module_docstring_example_runs():
    """The example of ``gpytorch_augment.testing``'s docstring defines a collectable class whose tests pass."""
    import gpytorch_augment.testing as testing

    source = testing.__doc__.split("::\n", 1)[1].split("\n\n``pytest``", 1)[0]
    namespace: dict = {}
    exec(inspect.cleandoc(source), namespace)
    cls = namespace["TestMyBernoulli"]
    assert issubclass(cls, AugmentedLikelihoodTestCase) and cls.case.name == "my_bernoulli"
    cls().test_c_deterministic_marginalisation(cls.case)
    d = protocol_data(cls.case)
    assert max(violation_aux_conditional(d.likelihood, d.y, d.f, d.generator).values()) <= 1


# ================================================================================================ can every check fail?
class _LambdaTimesY(BernoulliLogitLikelihood):
    """The reference docs' quadratic term -y f^2 omega / 2 (the factor y must not be there)."""

    def potential_and_precision(self, y, aux, f=None):
        h, lam = super().potential_and_precision(y, aux, f)
        return h, lam * (y > 0).to(lam.dtype)


class _WrongLogC(BernoulliLogitLikelihood):
    """log C = 0 instead of -log 2, in both the sampling and the variational side."""

    def log_tilt_constant(self, y, aux):
        return super().log_tilt_constant(y, aux) + LOG2

    def expected_log_tilt_constant(self, y, q_aux):
        return super().expected_log_tilt_constant(y, q_aux) + LOG2


class _HWithoutHalf(BernoulliLogitLikelihood):
    """h = s_y instead of s_y / 2, in both the sampling and the variational side."""

    def potential_and_precision(self, y, aux, f=None):
        h, lam = super().potential_and_precision(y, aux, f)
        return 2 * h, lam

    def expected_potential_and_precision(self, y, q_aux, f_mean, f_var):
        h, lam = super().expected_potential_and_precision(y, q_aux, f_mean, f_var)
        return 2 * h, lam


class _WrongAuxPosterior(BernoulliLogitLikelihood):
    """q(omega) = PG(1, sqrt(m^2 + 2 s)): not the optimum."""

    def aux_posterior(self, y, f_mean, f_var):
        return {"c": (f_mean**2 + 2 * f_var).sqrt()}


class _CollapsedWithoutVariance(BernoulliLogitLikelihood):
    """ell* evaluated at c = |m| (the variance forgotten): above E log p by Jensen."""

    def collapsed_bound(self, y, f_mean, f_var):
        return log_sigma_tilde_plus(self._sign(y).to(f_mean.dtype) * f_mean, f_mean.abs())


class _LambdaBarHalved(BernoulliLogitLikelihood):
    """A spurious /2 on the expected precision: the global step no longer maximises the ELBO."""

    def expected_potential_and_precision(self, y, q_aux, f_mean, f_var):
        h, lam = super().expected_potential_and_precision(y, q_aux, f_mean, f_var)
        return h, lam / 2


class _LogTiltInconsistent(BernoulliLogitLikelihood):
    """log_tilt overridden with h = s_y while potential_and_precision still says s_y / 2."""

    def log_tilt(self, y, aux, f):
        h, lam = self.potential_and_precision(y, aux, f)
        return self.log_tilt_constant(y, aux) + 2 * h * f - 0.5 * lam * f**2


def _broken(cls) -> AugmentedLikelihood:
    return cls().double()


@pytest.mark.parametrize("broken", [_LambdaTimesY, _WrongLogC, _HWithoutHalf])
def test_detects_a_wrong_augmentation(broken):
    d = protocol_data(BERNOULLI, likelihood=_broken(broken))
    ratios = violation_aux_conditional(d.likelihood, d.y, d.f, d.generator)
    assert ratios["equals log p(y|f)"] > 1e3, ratios
    good = protocol_data(BERNOULLI)
    assert worst(violation_aux_conditional(good.likelihood, good.y, good.f, good.generator)) <= 1


def test_detects_b_inconsistent_tilt():
    d = protocol_data(BERNOULLI, n=12, likelihood=_broken(_LogTiltInconsistent))
    torch.manual_seed(0)
    assert violation_f_conditional_exact(d.likelihood, d.y, d.f, d.generator)["constant across draws"] > 1e3
    d = protocol_data(BERNOULLI, n=20, likelihood=_broken(_LogTiltInconsistent))
    x = torch.linspace(-3, 3, 20).unsqueeze(-1)
    Z = torch.linspace(-2.7, 2.7, 6).unsqueeze(-1)
    assert violation_f_conditional_sparse(d.likelihood, x, d.y, d.f, Z, d.generator)["no perturbation improves"] > 1e3


@pytest.mark.parametrize("broken", [_WrongLogC, _HWithoutHalf, _LambdaTimesY])
def test_detects_c_wrong_constants(broken):
    d = protocol_data(BERNOULLI, likelihood=_broken(broken))
    assert violation_marginalisation(BERNOULLI, d.likelihood, d.y, d.f)["marginal = log p(y|f)"] > 1e3


@pytest.mark.parametrize(
    "broken, component",
    [
        (_HWithoutHalf, "autograd h_bar"),
        (_HWithoutHalf, "elbo_terms(q*) = collapsed_bound"),
        (_WrongAuxPosterior, "finite-difference slope vanishes"),
        (_WrongAuxPosterior, "perturbation never increases ell"),
        (_LambdaBarHalved, "autograd lambda_bar"),
    ],
)
def test_detects_e_non_stationary_or_inconsistent_q_aux(broken, component):
    d = protocol_data(BERNOULLI, likelihood=_broken(broken))
    ratios = violation_stationarity(d.likelihood, d.y, d.m, d.s, d.generator)
    assert ratios[component] > 1e3, ratios


@pytest.mark.parametrize(
    "broken, component",
    [(_CollapsedWithoutVariance, "ell* <= E log p"), (_WrongLogC, "tight at s = 0")],
)
def test_detects_f_bound_violations(broken, component):
    class _Broken(broken):
        # _WrongLogC changes log C, which the closed-form collapsed bound does not read: evaluate it generically
        if broken is _WrongLogC:
            collapsed_bound = AugmentedLikelihood.collapsed_bound

    d = protocol_data(BERNOULLI, likelihood=_broken(_Broken))
    assert violation_bound(BERNOULLI, d.likelihood, d.y, d.m, d.s)[component] > 1e3


def test_detects_f_gp_bound_violation():
    data = gp_data(BERNOULLI, n=30)
    data.likelihood = _broken(_CollapsedWithoutVariance)
    assert violation_bound_gp(data.likelihood, data, Z=data.x)["augmented ELBO <= true ELBO"] > 1e3


@pytest.mark.parametrize(
    "broken, component",
    [(_LambdaBarHalved, "monotone"), (_HWithoutHalf, "monotone"), (_WrongAuxPosterior, "step returns ELBO on entry")],
)
def test_detects_h_non_monotone_cavi(broken, component):
    data = gp_data(BERNOULLI, n=40)
    data.likelihood = _broken(broken)
    ratios = violation_cavi_monotone(data.likelihood, data, Z=torch.linspace(-3, 3, 10).unsqueeze(-1), sweeps=15)
    assert ratios[component] > 1e3, ratios


@pytest.mark.parametrize("name", ["BernoulliLogitLikelihood", "StudentTLikelihood", "PoissonLogitLikelihood"])
def test_an_integer_mean_of_q_f_is_refused_naming_it(name):
    # an int64 mean made every quadrature node an integer: expected_log_prob 0 and log_marginal -inf, silently
    import gpytorch

    import gpytorch_augment

    likelihood = getattr(gpytorch_augment, name)()
    q_f = gpytorch.distributions.MultivariateNormal(torch.tensor([0, 1]), torch.eye(2))
    y = torch.tensor([1.0, 0.0])
    for method in (likelihood.expected_log_prob, likelihood.log_marginal):
        with pytest.raises(ValueError, match="function_dist.*floating-point mean"):
            method(y, q_f)
