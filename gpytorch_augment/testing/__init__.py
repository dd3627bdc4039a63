r"""The protocol test suite of augmented likelihoods, shipped as GPyTorch ships ``gpytorch.test``.

Every :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood` must satisfy the identities of
:doc:`/maths/identities`: the full conditionals of :math:`\Omega` and :math:`f` (a, b), the deterministic
marginalisation of :math:`\Omega` (c), Monte-Carlo checks of the closed-form expectations (d), the stationarity
of :math:`q^*(\Omega)` (e), the two bounds (f), the Geweke test of the Gibbs sampler (g) and monotone CAVI (h),
plus shapes and dtypes and GPyTorch's own likelihood tests. A likelihood describes itself once, in a
:class:`LikelihoodCase`, and inherits every test by subclassing :class:`AugmentedLikelihoodTestCase`.

Importing this subpackage needs the test extra (``pip install gpytorch-augment[test]``: pytest, scipy);
``import gpytorch_augment`` does not import it.

Example (a test module of a package that defines its own likelihood; here the Bernoulli one)::

    import torch
    from gpytorch_augment import BernoulliLogitLikelihood
    from gpytorch_augment.distributions import PolyaGamma
    from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
    from gpytorch_augment.testing import AugmentedLikelihoodTestCase, LikelihoodCase, marginalise_single_pg


    class TestMyBernoulli(AugmentedLikelihoodTestCase):
        case = LikelihoodCase(
            name="my_bernoulli",
            make=lambda: BernoulliLogitLikelihood().double(),
            sample_targets=lambda f, generator, **kwargs: torch.bernoulli(torch.sigmoid(f), generator=generator),
            marginalise=marginalise_single_pg,
            q_aux_distribution=lambda likelihood, y, q_aux: AuxiliaryDistribution(
                omega=PolyaGamma(torch.ones_like(q_aux["c"]), q_aux["c"])
            ),
        )

``pytest`` then collects ``TestMyBernoulli`` with every test (``test_a_aux_full_conditional[0]`` ...
``test_gpytorch_base_likelihood[test_multi_batch]``). The checks are also plain functions, usable without pytest:
:func:`protocol_data` and :func:`gp_data` build the data, each ``violation_*`` function returns
``{component: error / tolerance}`` and the identity holds iff :func:`worst` of it is ``<= 1``.

Modules:

* :mod:`~gpytorch_augment.testing.case`: :class:`LikelihoodCase` (its docstring lists the rules for every field)
  and helpers for writing one (:func:`marginalise_single_pg`, :func:`log_pg_laplace`,
  :func:`gauss_hermite_expected_log_lik`);
* :mod:`~gpytorch_augment.testing.data`: the data recipes; :mod:`~gpytorch_augment.testing.models`: the small
  CAVI model the GP-level checks use;
* :mod:`~gpytorch_augment.testing.identities`: the ``violation_*`` checks (a)-(f), (h) and
  :func:`check_shapes_and_dtypes`;
* :mod:`~gpytorch_augment.testing.geweke`: the Geweke simulator (g), :func:`geweke_z`, and
  :func:`geweke_z_hyperparameters` for a kernel that samples the prior's hyper-parameters too;
* :mod:`~gpytorch_augment.testing.gpytorch_base`: GPyTorch's ``BaseLikelihoodTestCase`` for a case;
* :mod:`~gpytorch_augment.testing.suite`: :class:`AugmentedLikelihoodTestCase`.
"""

from gpytorch_augment.testing.case import (
    AuxDict,
    LikelihoodCase,
    cyclic_targets,
    gauss_hermite_expected_log_lik,
    log_pg_laplace,
    marginalise_single_pg,
    real_targets,
)
from gpytorch_augment.testing.data import function_dist, gp_data, latent_shape, protocol_data, to_latent_major
from gpytorch_augment.testing.geweke import (
    Z_TOL,
    ExplicitPrior,
    geweke_z,
    geweke_z_hyperparameters,
    tiny_prior,
    violation_geweke,
)
from gpytorch_augment.testing.gpytorch_base import (
    GPYTORCH_LIKELIHOOD_TESTS,
    GPyTorchLikelihoodTestCase,
    gpytorch_test_case,
)
from gpytorch_augment.testing.identities import (
    Ratios,
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
from gpytorch_augment.testing.models import SVGP, make_cavi_model
from gpytorch_augment.testing.suite import AugmentedLikelihoodTestCase, skip_if_not_applicable

__all__ = [
    "AugmentedLikelihoodTestCase",
    "AuxDict",
    "ExplicitPrior",
    "GPYTORCH_LIKELIHOOD_TESTS",
    "GPyTorchLikelihoodTestCase",
    "LikelihoodCase",
    "Ratios",
    "SVGP",
    "Z_TOL",
    "check_shapes_and_dtypes",
    "cyclic_targets",
    "function_dist",
    "gauss_hermite_expected_log_lik",
    "geweke_z",
    "geweke_z_hyperparameters",
    "gp_data",
    "gpytorch_test_case",
    "latent_shape",
    "log_pg_laplace",
    "make_cavi_model",
    "marginalise_single_pg",
    "protocol_data",
    "real_targets",
    "skip_if_not_applicable",
    "tiny_prior",
    "to_latent_major",
    "violation_aux_conditional",
    "violation_bound",
    "violation_bound_gp",
    "violation_cavi_monotone",
    "violation_f_conditional_exact",
    "violation_f_conditional_sparse",
    "violation_geweke",
    "violation_marginalisation",
    "violation_monte_carlo",
    "violation_stationarity",
    "worst",
]
