r"""The protocol test suite as a pytest base class: a likelihood sets its case and inherits every test.

:class:`AugmentedLikelihoodTestCase` runs, for its :class:`~gpytorch_augment.testing.case.LikelihoodCase`, every
identity of :doc:`/maths/identities`, (a) to (h), the shape and dtype checks, and GPyTorch's
own ``BaseLikelihoodTestCase`` tests. Each test asserts that every ratio of the corresponding ``violation_*`` check
of :mod:`gpytorch_augment.testing.identities` is ``<= 1``, with the case's tolerances. An identity listed in
``case.skip`` is skipped with its reason.

A subclass leaves a test out by setting it to ``None``, e.g. ``test_g_geweke = None`` where the Geweke test of the
Gibbs sampler (identity (g), the slowest: tens of seconds per likelihood) runs elsewhere with other settings.

The tests read the case from the fixture ``likelihood_case``, which returns the class attribute ``case``; a test
module that runs the suite over a list of cases overrides that fixture with a parametrised one::

    class TestProtocol(AugmentedLikelihoodTestCase):
        @pytest.fixture(params=CASES, ids=lambda case: case.name)
        def likelihood_case(self, request):
            return request.param
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from gpytorch_augment.testing.case import LikelihoodCase
from gpytorch_augment.testing.data import gp_data, protocol_data
from gpytorch_augment.testing.geweke import Z_TOL, geweke_z
from gpytorch_augment.testing.gpytorch_base import GPYTORCH_LIKELIHOOD_TESTS, gpytorch_test_case
from gpytorch_augment.testing.identities import (
    check_shapes_and_dtypes,
    violation_aux_conditional,
    violation_bound,
    violation_bound_gp,
    violation_cavi_monotone,
    violation_f_conditional_exact,
    violation_f_conditional_sparse,
    violation_marginalisation,
    violation_monte_carlo,
    violation_stationarity,
    worst,
)


def skip_if_not_applicable(case: LikelihoodCase, letter: str) -> None:
    """``pytest.skip`` with the case's reason if the identity ``letter`` is in ``case.skip``.

    Example::

        >>> import dataclasses, pytest
        >>> from gpytorch_augment.testing.suite import skip_if_not_applicable
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> skip_if_not_applicable(BERNOULLI_CASE, "g")                # applies: returns, nothing skipped
        >>> case = dataclasses.replace(BERNOULLI_CASE, skip={"g": "no sampler"})
        >>> try:
        ...     skip_if_not_applicable(case, "g")
        ... except pytest.skip.Exception as skipped:
        ...     print(skipped.msg)
        identity (g) does not apply to bernoulli_example: no sampler
    """
    if letter in case.skip:
        pytest.skip(f"identity ({letter}) does not apply to {case.name}: {case.skip[letter]}")


class AugmentedLikelihoodTestCase:
    """Every protocol test for the likelihood of :attr:`case` (see the module docstring).

    Example::

        >>> class TestMyLikelihood(AugmentedLikelihoodTestCase):
        ...     case = LikelihoodCase(name="mine", make=..., sample_targets=..., marginalise=...,
        ...                           q_aux_distribution=...)
    """

    #: the likelihood under test
    case: LikelihoodCase

    @pytest.fixture
    def likelihood_case(self) -> LikelihoodCase:
        """The case under test: :attr:`case` (override with a parametrised fixture to test several)."""
        case = getattr(self, "case", None)
        if not isinstance(case, LikelihoodCase):
            raise TypeError(f"{type(self).__name__} must set the class attribute `case` to a LikelihoodCase")
        return case

    @pytest.fixture(autouse=True)
    def _float64(self) -> Iterator[None]:
        """The identity tolerances are float64 tolerances: the data recipes draw in the default dtype."""
        dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        yield
        torch.set_default_dtype(dtype)

    # ------------------------------------------------------------------ (a)
    @pytest.mark.parametrize("seed", [0, 1])
    def test_a_aux_full_conditional(self, likelihood_case: LikelihoodCase, seed: int) -> None:
        case = likelihood_case
        skip_if_not_applicable(case, "a")
        d = protocol_data(case, seed=seed)
        ratios = violation_aux_conditional(d.likelihood, d.y, d.f, d.generator, rtol=case.consistency_rtol)
        assert worst(ratios) <= 1, ratios

    # ------------------------------------------------------------------ (b)
    def test_b_f_full_conditional_exact(self, likelihood_case: LikelihoodCase) -> None:
        case = likelihood_case
        skip_if_not_applicable(case, "b")
        d = protocol_data(case, n=12)
        torch.manual_seed(0)  # the f draws
        ratios = violation_f_conditional_exact(d.likelihood, d.y, d.f, d.generator)
        assert worst(ratios) <= 1, ratios

    def test_b_f_full_conditional_sparse(self, likelihood_case: LikelihoodCase) -> None:
        case = likelihood_case
        skip_if_not_applicable(case, "b")
        d = protocol_data(case, n=20)
        x = torch.linspace(-3, 3, 20).unsqueeze(-1)
        Z = torch.linspace(-2.7, 2.7, 6).unsqueeze(-1)
        ratios = violation_f_conditional_sparse(d.likelihood, x, d.y, d.f, Z, d.generator)
        assert worst(ratios) <= 1, ratios

    # ------------------------------------------------------------------ (c)
    def test_c_deterministic_marginalisation(self, likelihood_case: LikelihoodCase) -> None:
        case = likelihood_case
        skip_if_not_applicable(case, "c")
        d = protocol_data(case, n=20)
        f = d.f.clone()
        f[:3] = torch.tensor([-case.f_bound, 0.0, case.f_bound]).view(3, *([1] * (f.dim() - 1)))  # edges and 0
        ratios = violation_marginalisation(case, d.likelihood, d.y, f)
        assert worst(ratios) <= 1, ratios

    # ------------------------------------------------------------------ (d)
    def test_d_monte_carlo_expectations(self, likelihood_case: LikelihoodCase) -> None:
        case = likelihood_case
        skip_if_not_applicable(case, "d")
        d = protocol_data(case, n=10)
        torch.manual_seed(0)
        ratios = violation_monte_carlo(case, d.likelihood, d.y, d.m, d.s, d.generator)
        assert worst(ratios) <= 1, ratios

    # ------------------------------------------------------------------ (e)
    @pytest.mark.parametrize("seed", [0, 1])
    def test_e_aux_posterior_is_stationary(self, likelihood_case: LikelihoodCase, seed: int) -> None:
        case = likelihood_case
        skip_if_not_applicable(case, "e")
        d = protocol_data(case, seed=seed)
        ratios = violation_stationarity(d.likelihood, d.y, d.m, d.s, d.generator)
        assert worst(ratios) <= 1, ratios

    # ------------------------------------------------------------------ (f)
    @pytest.mark.parametrize("seed", [0, 1])
    def test_f_augmented_bound_below_true_expected_log_lik(self, likelihood_case: LikelihoodCase, seed: int) -> None:
        case = likelihood_case
        skip_if_not_applicable(case, "f")
        d = protocol_data(case, seed=seed)
        ratios = violation_bound(case, d.likelihood, d.y, d.m, d.s)
        assert worst(ratios) <= 1, ratios

    def test_f_augmented_elbo_below_true_elbo_full_gp(self, likelihood_case: LikelihoodCase) -> None:
        case = likelihood_case
        skip_if_not_applicable(case, "f")
        data = gp_data(case, n=30)
        ratios = violation_bound_gp(data.likelihood, data, Z=data.x)
        assert worst(ratios) <= 1, ratios

    # ------------------------------------------------------------------ (g)
    def test_g_geweke(self, likelihood_case: LikelihoodCase) -> None:
        case = likelihood_case
        skip_if_not_applicable(case, "g")
        z = geweke_z(case.make(), case.sample_targets, make_kwargs=case.make_kwargs)
        assert z.abs().max() <= Z_TOL, z

    # ------------------------------------------------------------------ (h)
    @pytest.mark.parametrize("sparse", [False, True], ids=["exact", "sparse"])
    def test_h_cavi_elbo_never_decreases(self, likelihood_case: LikelihoodCase, sparse: bool) -> None:
        case = likelihood_case
        skip_if_not_applicable(case, "h")
        data = gp_data(case, n=40)
        Z = torch.linspace(-3, 3, 10).unsqueeze(-1) if sparse else data.x
        ratios = violation_cavi_monotone(data.likelihood, data, Z, sweeps=case.cavi_sweeps)
        assert worst(ratios) <= 1, ratios

    def test_h_cavi_elbo_never_decreases_float32(self, likelihood_case: LikelihoodCase) -> None:
        case = likelihood_case
        skip_if_not_applicable(case, "h")
        data = gp_data(case, n=40, dtype=torch.float32)
        Z = torch.linspace(-3, 3, 10, dtype=torch.float32).unsqueeze(-1)
        ratios = violation_cavi_monotone(data.likelihood, data, Z, sweeps=30, rtol=1e-5, converge_rtol=1e-5)
        assert worst(ratios) <= 1, ratios

    # ------------------------------------------------------------------ shapes, dtypes
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
    def test_shapes_and_dtypes(self, likelihood_case: LikelihoodCase, dtype: torch.dtype) -> None:
        """Every pure protocol member accepts a batch (3, N), keeps the dtype, and returns one value per datum."""
        check_shapes_and_dtypes(likelihood_case, dtype)

    # ------------------------------------------------------------------ GPyTorch's BaseLikelihoodTestCase
    @pytest.mark.parametrize("method", GPYTORCH_LIKELIHOOD_TESTS)
    def test_gpytorch_base_likelihood(self, likelihood_case: LikelihoodCase, method: str) -> None:
        """GPyTorch's own likelihood test ``method`` (see :mod:`gpytorch_augment.testing.gpytorch_base`)."""
        test = gpytorch_test_case(likelihood_case)(method)
        test.setUp()
        try:
            getattr(test, method)()
        finally:
            test.tearDown()
