r"""GPyTorch's own likelihood tests (``gpytorch.test.base_likelihood_test_case.BaseLikelihoodTestCase``) for a
registered :class:`~gpytorch_augment.testing.case.LikelihoodCase`.

GPyTorch's base class checks that ``likelihood(f)`` and ``likelihood(q_f)`` are distributions of the right shape
and that ``expected_log_prob``, ``log_marginal`` and ``marginal`` agree (``rtol = 0.25``) with GPyTorch's generic
Monte-Carlo implementations, without a batch, with a batch ``(3,)`` and with a batch ``(2, 3)``
(``test_nonbatch``, ``test_batch``, ``test_multi_batch``). Its inputs assume one latent and real-valued targets;
:class:`GPyTorchLikelihoodTestCase` supplies instead:

* **targets** drawn from the model by the case (``case.sample_targets`` at latents :math:`f\sim\mathcal N(0, 1)`),
  so they lie in the likelihood's domain (labels, counts, successes out of trials);
* **inputs** for ``T > 1`` latents: conditional inputs ``(*batch, 5, T)`` and a ``MultitaskMultivariateNormal``
  with ``T`` independent tasks, each with GPyTorch's covariance recipe :math:`AA^\top + I`;
* **keyword data** (``case.make_kwargs``, e.g. binomial ``trials``) passed to every call, for the targets and the
  likelihood alike;
* where the case asks for it (``case.extras["gpytorch_covariance_scale"]``), GPyTorch's marginal-input covariance
  scaled down, for a likelihood whose predictive mean is so heavy-tailed in :math:`f` (e.g. the negative binomial,
  mean :math:`r e^f`) that GPyTorch's 30000-draw Monte-Carlo reference is not within 25% at variances near 6.

A case may also skip one of GPyTorch's four helpers with a reason (``case.extras["gpytorch_skip"]``:
``{"_test_marginal": "why"}``); the test then reports that skip after the helpers before it have run and passed
(GPyTorch calls them in the order conditional, log-marginal, expected log-probability, marginal).

Where one of the last two applies, the four ``_test_*`` helpers are GPyTorch's checks with the same tolerances,
generalised as follows: the keyword data go to every call; a draw of ``y`` has the shape of the latents without
the latent dimension; the mean of a ``Categorical`` is its vector of class probabilities (the mean of the one-hot
encoding; ``torch`` reports NaN); with keyword data, GPyTorch's Monte-Carlo reference estimators are evaluated
with the keyword data given to the conditional only (GPyTorch's generic ``expected_log_prob`` would also pass them
to ``Distribution.log_prob``, which takes none). Otherwise GPyTorch's helpers run unchanged.

Usage (``unittest`` style, as GPyTorch's own tests)::

    >>> import unittest
    >>> from gpytorch_augment.testing import GPyTorchLikelihoodTestCase
    >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
    >>> class TestMyLikelihoodGPyTorch(GPyTorchLikelihoodTestCase, unittest.TestCase):
    ...     case = BERNOULLI_CASE

:class:`~gpytorch_augment.testing.suite.AugmentedLikelihoodTestCase` runs the same three tests for its case.
"""

from __future__ import annotations

import math
import unittest
from collections.abc import Callable
from typing import Any

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.likelihoods import Likelihood
from gpytorch.test.base_likelihood_test_case import BaseLikelihoodTestCase
from torch import Tensor
from torch.distributions import Categorical, Distribution

from gpytorch_augment.likelihoods import AugmentedLikelihood
from gpytorch_augment.testing.case import LikelihoodCase
from gpytorch_augment.testing.data import function_dist

#: the test methods GPyTorch's ``BaseLikelihoodTestCase`` defines
GPYTORCH_LIKELIHOOD_TESTS = ("test_nonbatch", "test_batch", "test_multi_batch")

_NUM_DATA = 5  # GPyTorch's input recipe


def _mean(dist: Distribution) -> Tensor:
    """The mean of ``y``; for a ``Categorical``, the class probabilities (the mean of the one-hot encoding)."""
    return dist.probs if isinstance(dist, Categorical) else dist.mean


def _generic(
    member: str, likelihood: Likelihood, target: Tensor, input: MultivariateNormal, keyword_data: dict[str, Tensor]
) -> Tensor:
    """GPyTorch's generic Monte-Carlo ``expected_log_prob`` / ``log_marginal``, the keyword data given to the
    conditional only."""
    if not keyword_data:
        return getattr(Likelihood, member)(likelihood, target, input)
    log_probs = Likelihood._draw_likelihood_samples(likelihood, input, **keyword_data).log_prob(target)
    if member == "expected_log_prob":
        return log_probs.mean(0)
    return log_probs.sub(math.log(log_probs.shape[0])).logsumexp(0)


class GPyTorchLikelihoodTestCase(BaseLikelihoodTestCase):
    """GPyTorch's ``BaseLikelihoodTestCase`` for the likelihood of :attr:`case` (see the module docstring).

    Subclass it together with ``unittest.TestCase`` and set :attr:`case`.

    Example::

        >>> import unittest
        >>> from gpytorch_augment.testing.gpytorch_base import GPyTorchLikelihoodTestCase
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> class BernoulliTests(GPyTorchLikelihoodTestCase, unittest.TestCase):
        ...     case = BERNOULLI_CASE
        >>> BernoulliTests("test_nonbatch").run().wasSuccessful()
        True
    """

    #: the registered likelihood
    case: LikelihoodCase
    #: GPyTorch's ``BaseTestCase`` seeds torch with it in ``setUp``
    seed = 0

    def create_likelihood(self, **kwargs: Any) -> AugmentedLikelihood:
        return self.case.make().to(torch.get_default_dtype())

    @property
    def _adapted(self) -> bool:
        """Whether GPyTorch's helpers need the generalisation (several latents, keyword data, or a ``Categorical``
        predictive, whose ``mean`` GPyTorch's helpers would read)."""
        if self.case.num_latents > 1 or bool(self.case.make_kwargs(torch.Size([_NUM_DATA]), torch.Generator())):
            return True
        return isinstance(self.create_likelihood()(torch.zeros(_NUM_DATA)), Categorical)

    def _generator(self) -> torch.Generator:
        """A generator seeded from torch's global RNG (which ``setUp`` seeds)."""
        return torch.Generator().manual_seed(int(torch.randint(0, 2**62, ())))

    def _keyword_data(self, batch_shape: torch.Size) -> dict[str, Tensor]:
        data = self.case.make_kwargs(batch_shape + torch.Size([_NUM_DATA]), self._generator())
        return {k: v.to(torch.get_default_dtype()) if v.is_floating_point() else v for k, v in data.items()}

    def _create_conditional_input(self, batch_shape: torch.Size = torch.Size()) -> Tensor:
        T = self.case.num_latents
        return torch.randn(*batch_shape, _NUM_DATA, *((T,) if T > 1 else ()))

    def _create_marginal_input(self, batch_shape: torch.Size = torch.Size()) -> MultivariateNormal:
        T = self.case.num_latents
        scale = float(self.case.extras.get("gpytorch_covariance_scale", 1.0))
        if T == 1 and scale == 1.0:
            return super()._create_marginal_input(batch_shape)
        latents = torch.Size([T]) if T > 1 else torch.Size()
        mat = torch.randn(*batch_shape, *latents, _NUM_DATA, _NUM_DATA)
        eye = torch.diag_embed(torch.ones(*batch_shape, *latents, _NUM_DATA))
        return function_dist(torch.randn(*batch_shape, *latents, _NUM_DATA), scale * (mat @ mat.mT + eye), T)

    def _skip_if_requested(self, helper: str) -> None:
        reason = self.case.extras.get("gpytorch_skip", {}).get(helper)
        if reason:
            self.skipTest(f"GPyTorch's {helper} does not apply to {self.case.name}: {reason}")

    def _create_targets(self, batch_shape: torch.Size = torch.Size(), **keyword_data: Tensor) -> Tensor:
        """Targets drawn from the model at latents :math:`f\\sim\\mathcal N(0, 1)` (with ``keyword_data``, or the
        case's own for ``batch_shape``)."""
        if not keyword_data:
            keyword_data = self._keyword_data(batch_shape)
        f = self._create_conditional_input(batch_shape)
        return self.case.sample_targets(f, self._generator(), **keyword_data).to(f.dtype)

    # ------------------------------------------------------------------ GPyTorch's checks, generalised
    def _setup(
        self, batch_shape: torch.Size, create_input: Callable[[torch.Size], Any]
    ) -> tuple[AugmentedLikelihood, dict[str, Tensor], Any]:
        """A fresh likelihood (with GPyTorch's plate nesting for the batch), keyword data and an input."""
        likelihood = self.create_likelihood()
        likelihood.max_plate_nesting += len(batch_shape)
        return likelihood, self._keyword_data(batch_shape), create_input(batch_shape)

    def _check_predictive(self, output: Distribution, batch_shape: torch.Size) -> None:
        """A distribution whose draws have the shape of the data (the latents without their latent dimension)."""
        self.assertTrue(isinstance(output, Distribution))
        self.assertEqual(output.sample().shape, batch_shape + torch.Size([_NUM_DATA]))

    def _test_conditional(self, batch_shape: torch.Size) -> None:
        self._skip_if_requested("_test_conditional")
        if not self._adapted:
            return super()._test_conditional(batch_shape)
        likelihood, keyword_data, input = self._setup(batch_shape, self._create_conditional_input)
        self._check_predictive(likelihood(input, **keyword_data), batch_shape)

    def _test_log_marginal(self, batch_shape: torch.Size) -> None:
        self._skip_if_requested("_test_log_marginal")
        if not self._adapted:
            return super()._test_log_marginal(batch_shape)
        self._compare_with_default("log_marginal", batch_shape)

    def _test_log_prob(self, batch_shape: torch.Size) -> None:
        self._skip_if_requested("_test_log_prob")
        if not self._adapted:
            return super()._test_log_prob(batch_shape)
        self._compare_with_default("expected_log_prob", batch_shape)

    def _compare_with_default(self, member: str, batch_shape: torch.Size) -> None:
        likelihood, keyword_data, input = self._setup(batch_shape, self._create_marginal_input)
        target = self._create_targets(batch_shape, **keyword_data)
        with gpytorch.settings.num_likelihood_samples(512):
            output = getattr(likelihood, member)(target, input, **keyword_data)
        self.assertTrue(torch.is_tensor(output))
        self.assertEqual(output.shape, batch_shape + torch.Size([_NUM_DATA]))
        with gpytorch.settings.num_likelihood_samples(512):
            default = _generic(member, likelihood, target, input, keyword_data)
        self.assertAllClose(output, default, rtol=0.25)

    def _test_marginal(self, batch_shape: torch.Size) -> None:
        self._skip_if_requested("_test_marginal")
        if not self._adapted:
            return super()._test_marginal(batch_shape)
        likelihood, keyword_data, input = self._setup(batch_shape, self._create_marginal_input)
        output = likelihood(input, **keyword_data)
        self._check_predictive(output, batch_shape)
        with gpytorch.settings.num_likelihood_samples(30000):
            default = Likelihood.marginal(likelihood, input, **keyword_data)
        default_mean, actual_mean = _mean(default), _mean(output)
        if default_mean.dim() > actual_mean.dim():
            default_mean = default_mean.mean(0)
        self.assertAllClose(default_mean, actual_mean, rtol=0.25, atol=0.25)


def gpytorch_test_case(case: LikelihoodCase) -> type[unittest.TestCase]:
    """A ``unittest.TestCase`` class running GPyTorch's likelihood tests on ``case`` (not collected by pytest on
    its own: its name does not start with ``Test``).

    Example::

        >>> from gpytorch_augment.testing.gpytorch_base import gpytorch_test_case
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> tests = gpytorch_test_case(BERNOULLI_CASE)
        >>> tests.__name__, tests("test_batch").run().wasSuccessful()
        ('GPyTorchLikelihoodTests_bernoulli_example', True)
    """
    name = "GPyTorchLikelihoodTests_" + "".join(c if c.isalnum() else "_" for c in case.name)
    return type(name, (GPyTorchLikelihoodTestCase, unittest.TestCase), {"case": case, "__test__": False})
