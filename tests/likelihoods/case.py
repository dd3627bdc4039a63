"""Moved: the :class:`LikelihoodCase` record and its helpers ship as :mod:`gpytorch_augment.testing.case`; this
module re-exports them for imports written against the old location."""

from gpytorch_augment.testing.case import (
    AuxDict,
    LikelihoodCase,
    gauss_hermite_expected_log_lik,
    log_pg_laplace,
    marginalise_single_pg,
)

__all__ = ["AuxDict", "LikelihoodCase", "gauss_hermite_expected_log_lik", "log_pg_laplace", "marginalise_single_pg"]
