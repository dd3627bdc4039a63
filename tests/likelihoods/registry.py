r"""The registry of this package's likelihoods: :data:`CASES`, the single list the protocol suite runs over.

Every augmented likelihood of ``gpytorch_augment`` registers **once**, here, and inherits every test of the shipped
suite :mod:`gpytorch_augment.testing` (``test_protocol.py``: the identities (a)-(f), (h) of docs/maths/index.md
shapes and dtypes, GPyTorch's ``BaseLikelihoodTestCase``; ``tests/inference/test_geweke.py``: the Geweke test
(g) of the Gibbs sampler; ``tests/test_regression_pins.py``: pinned CAVI and Gibbs runs).

How a likelihood of this package registers
-----------------------------------------
Write a ``cases_<family>.py`` module defining a :class:`~gpytorch_augment.testing.LikelihoodCase` per likelihood
(its docstring gives the rules for every field) and add it to :data:`CASES` below::

    POISSON = LikelihoodCase(
        name="poisson_logit",
        make=lambda: PoissonLogitLikelihood(rate_scale=3.7).double(),      # fresh, float64, non-default constants
        sample_targets=lambda f, generator, **kwargs: torch.poisson(3.7 * torch.sigmoid(f), generator=generator),
        marginalise=marginalise_poisson,                                   # log ∫ tilt p(Ω|y) dΩ, no sampling
        q_aux_distribution=_poisson_q_aux,                                 # the law of q*(Ω), for Monte Carlo
        cavi_sweeps=80,                                                    # why, in a comment
    )

Nothing else changes: the tests are parametrised over :data:`CASES`. Helpers for the common pieces live in
:mod:`gpytorch_augment.testing.case` (:func:`~gpytorch_augment.testing.marginalise_single_pg` for one Pólya-Gamma
variable, :func:`~gpytorch_augment.testing.log_pg_laplace`, the default Gauss--Hermite ``expected_log_lik``).

How a third-party likelihood registers
--------------------------------------
A package that defines its own :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood` does not edit this list:
in its own test suite it subclasses :class:`~gpytorch_augment.testing.AugmentedLikelihoodTestCase` and sets the
case, and pytest collects every test for it::

    from gpytorch_augment.testing import AugmentedLikelihoodTestCase, LikelihoodCase

    class TestMyLikelihood(AugmentedLikelihoodTestCase):
        case = LikelihoodCase(name="mine", make=..., sample_targets=..., marginalise=..., q_aux_distribution=...)

``test_protocol.py`` registers the two-latent toy of ``toy_multilatent.py`` this way
(``TestTwoBitLogitThirdParty``), as a check of that route and of the multi-latent paths.
"""

from __future__ import annotations

from gpytorch_augment.testing import LikelihoodCase
from tests.likelihoods.cases_binary import BERNOULLI
from tests.likelihoods.cases_counts import COUNT_CASES
from tests.likelihoods.cases_heteroscedastic import HETEROSCEDASTIC_CASES
from tests.likelihoods.cases_multiclass import MULTICLASS_CASES
from tests.likelihoods.cases_ordinal import ORDINAL_CASES
from tests.likelihoods.cases_robust import ROBUST_CASES

#: every registered likelihood; ``test_protocol.py``, the Gibbs Geweke test and the regression pins run over it
CASES: list[LikelihoodCase] = [BERNOULLI, *COUNT_CASES, *ROBUST_CASES, *MULTICLASS_CASES, *HETEROSCEDASTIC_CASES]
CASES += ORDINAL_CASES

__all__ = ["BERNOULLI", "CASES", "LikelihoodCase"]
