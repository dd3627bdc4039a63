r"""Numerical building blocks shared by every likelihood and engine.

Everything that needs care in floating point lives here, once, in three modules re-exported here
(:mod:`~gpytorch_augment._numerics.special`, :mod:`~gpytorch_augment._numerics.quadrature`,
:mod:`~gpytorch_augment._numerics.solvers`):

* special functions: :func:`log_cosh`; :func:`pg_mean`, :func:`pg_variance`, :func:`pg_kl` (moments of
  :math:`\mathrm{PG}(b, c)` and :math:`\mathrm{KL}(\mathrm{PG}(b,c)\,\Vert\,\mathrm{PG}(b,0))`, stable in value and
  gradient as :math:`c \to 0`); :func:`pg_tilt_c`, the tilt :math:`c = \sqrt{m^2 + s}` of an optimal Pólya-Gamma
  :math:`q`; :func:`log_sigma_tilde_plus`, :func:`log_sigma_tilde` (the logistic bounds); :func:`log1mexp`;
  :func:`student_t_log_normaliser`;
* one-dimensional integrals: :func:`gauss_hermite`, :func:`gauss_hermite_expectation` and :func:`quadrature_mixture`
  (expectations, with their derivatives, and predictives over :math:`\mathcal N(m, s)`), :func:`log_trapezoid` (the
  trapezoid rule on a log scale) and :func:`expected_log1p_square` (:math:`E\log(1 + (y-f)^2/c)` by Frullani's
  integral);
* integrals over independent Gaussian latents: :func:`standard_normal_rule`, :func:`latent_expectation` (product
  Gauss--Hermite for :math:`J \le 3`, scrambled-Sobol quasi-Monte Carlo beyond) and :func:`additive_product_rule`
  (the product rule for functions of a sum of per-latent terms, at the cost of its one-dimensional rules);
* optimisation: :func:`safeguarded_newton`, the bracketed Newton root finder (elementwise, vectorised), and
  :func:`bounded_maximise`, the one-dimensional bounded search (grid, then golden section; vectorised);
* linear algebra: :func:`reverse_cholesky`;
* Laplace transforms: :func:`euler_inversion`, the Abate--Whitt Euler inversion of a Laplace transform (the CDF
  and density of a positive law from its transform, vectorised over points).
"""

from .quadrature import (
    LOG1P_SQUARE_STEP,
    LOG_GRID_NODES,
    LOG_GRID_TAIL,
    NUM_QMC_POINTS,
    PRODUCT_RULE_NODES,
    QuadratureMixture,
    additive_product_rule,
    discrete_mixture_cdf,
    discrete_mixture_quantile,
    expected_log1p_square,
    gauss_hermite,
    gauss_hermite_expectation,
    latent_expectation,
    log_trapezoid,
    quadrature_mixture,
    split_gauss_legendre,
    standard_normal_rule,
)
from .solvers import (
    EULER_A,
    EULER_AVERAGED,
    EULER_TERMS,
    bounded_maximise,
    euler_inversion,
    reverse_cholesky,
    safeguarded_newton,
)
from .special import (
    LOG2,
    log1mexp,
    log_cosh,
    log_cosh_sqrt,
    log_normal_matern32,
    log_sigma_tilde,
    log_sigma_tilde_moments,
    log_sigma_tilde_plus,
    pg_kl,
    pg_mean,
    pg_mean_from_square,
    pg_tilt_c,
    pg_variance,
    student_t_log_normaliser,
)

__all__ = [
    "EULER_A",
    "EULER_AVERAGED",
    "EULER_TERMS",
    "LOG2",
    "LOG_GRID_NODES",
    "LOG_GRID_TAIL",
    "LOG1P_SQUARE_STEP",
    "NUM_QMC_POINTS",
    "PRODUCT_RULE_NODES",
    "QuadratureMixture",
    "additive_product_rule",
    "bounded_maximise",
    "discrete_mixture_cdf",
    "discrete_mixture_quantile",
    "euler_inversion",
    "expected_log1p_square",
    "gauss_hermite",
    "gauss_hermite_expectation",
    "latent_expectation",
    "log1mexp",
    "log_cosh",
    "log_cosh_sqrt",
    "log_normal_matern32",
    "log_sigma_tilde",
    "log_sigma_tilde_moments",
    "log_sigma_tilde_plus",
    "log_trapezoid",
    "pg_kl",
    "pg_mean",
    "pg_mean_from_square",
    "pg_tilt_c",
    "pg_variance",
    "quadrature_mixture",
    "reverse_cholesky",
    "safeguarded_newton",
    "split_gauss_legendre",
    "standard_normal_rule",
    "student_t_log_normaliser",
]
