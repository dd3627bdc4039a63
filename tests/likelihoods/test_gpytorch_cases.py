"""GPyTorch's own test base classes, run against our likelihood and our CAVI strategies
(GPyTorch's own likelihood test cases).

* ``BaseLikelihoodTestCase`` on :class:`BernoulliLogitLikelihood` (labels in {0, 1}; the class ``seed`` is kept).
* ``VariationalTestCase`` on :class:`CAVIVariationalStrategy` and :class:`UnwhitenedCAVIVariationalStrategy`,
  unchanged (Cholesky distribution, ``VariationalELBO``, Gaussian likelihood): the CAVI strategies must remain
  drop-in GPyTorch strategies.
* The same ``VariationalTestCase`` with ``likelihood_cls=BernoulliLogitLikelihood`` and ``mll_cls=AugmentedELBO``;
  ``_training_iter`` is overridden only so that the targets are valid labels. Fantasy models need a Gaussian
  likelihood in GPyTorch, so the fantasy tests apply to the strategy variants above, not to this one.
"""

from __future__ import annotations

import unittest

import gpytorch
import pytest
import torch
from gpytorch.test.base_likelihood_test_case import BaseLikelihoodTestCase
from gpytorch.test.variational_test_case import VariationalTestCase

from gpytorch_augment import (
    AugmentedELBO,
    BernoulliLogitLikelihood,
    CAVIVariationalStrategy,
    UnwhitenedCAVIVariationalStrategy,
)

# GPyTorch's VariationalTestCase returns its mocks from test methods (for its own subclasses to inspect)
pytestmark = pytest.mark.filterwarnings("ignore:It is deprecated to return a value that is not None:DeprecationWarning")


class TestBernoulliLogitLikelihood(BaseLikelihoodTestCase, unittest.TestCase):
    seed = 1

    def create_likelihood(self, **kwargs):
        return BernoulliLogitLikelihood(**kwargs)

    def _create_targets(self, batch_shape=torch.Size()):
        return torch.randn(*batch_shape, 5).gt(0).to(torch.get_default_dtype())

    def test_expected_log_prob_is_the_true_one(self):
        """Tighter than the base class: our quadrature value against 2e5 Monte-Carlo draws (5 standard errors)."""
        likelihood = self.create_likelihood()
        q_f = self._create_marginal_input(torch.Size([3]))
        y = self._create_targets(torch.Size([3]))
        f = q_f.rsample(torch.Size([200_000]))
        log_p = likelihood.forward(f).log_prob(y)
        se = log_p.std(0) / log_p.shape[0] ** 0.5
        ours = likelihood.expected_log_prob(y, q_f)
        self.assertTrue(bool(((ours - log_p.mean(0)).abs() <= 5 * se + 1e-6).all()))


class _CAVIStrategyCase(VariationalTestCase):
    @property
    def batch_shape(self):
        return torch.Size([])

    @property
    def distribution_cls(self):
        return gpytorch.variational.CholeskyVariationalDistribution

    @property
    def mll_cls(self):
        return gpytorch.mlls.VariationalELBO


class TestCAVIVariationalStrategy(_CAVIStrategyCase, unittest.TestCase):
    seed = 0

    @property
    def strategy_cls(self):
        return CAVIVariationalStrategy


class TestUnwhitenedCAVIVariationalStrategy(_CAVIStrategyCase, unittest.TestCase):
    seed = 0

    @property
    def strategy_cls(self):
        return UnwhitenedCAVIVariationalStrategy


class _AugmentedClassificationCase(_CAVIStrategyCase):
    """Our strategy + our likelihood + our MLL in GPyTorch's generic training/eval checks."""

    @property
    def likelihood_cls(self):
        return BernoulliLogitLikelihood

    @property
    def mll_cls(self):
        return AugmentedELBO

    def _training_iter(self, model, likelihood, batch_shape=torch.Size([]), mll_cls=AugmentedELBO, cuda=False):
        # the base class regresses on linspace(-1, 1, 32); use the sign of the same ramp as {0, 1} labels
        train_x = torch.randn(*batch_shape, 32, 2).clamp(-2.5, 2.5)
        train_y = torch.linspace(-1, 1, self.event_shape[0]).gt(0).to(train_x.dtype)
        mll = mll_cls(likelihood, model, num_data=train_x.size(-2))
        model.train()
        likelihood.train()
        output = model(train_x)
        loss = -mll(output, train_y)
        loss.sum().backward()
        for _, param in model.named_parameters():
            self.assertTrue(param.grad is not None)
            self.assertGreater(param.grad.norm().item(), 0)
        for _, param in likelihood.named_parameters():
            self.assertTrue(param.grad is not None)
            self.assertGreater(param.grad.norm().item(), 0)
        return output, loss

    def test_fantasy_call(self, *args, **kwargs):
        self.skipTest("GPyTorch fantasy models need a Gaussian likelihood; covered by the strategy-only cases")


class TestCAVIStrategyAugmentedBernoulli(_AugmentedClassificationCase, unittest.TestCase):
    seed = 0

    @property
    def strategy_cls(self):
        return CAVIVariationalStrategy


class TestUnwhitenedCAVIStrategyAugmentedBernoulli(_AugmentedClassificationCase, unittest.TestCase):
    seed = 0

    @property
    def strategy_cls(self):
        return UnwhitenedCAVIVariationalStrategy


class TestCAVIStrategyAugmentedBernoulliNatural(TestCAVIStrategyAugmentedBernoulli):
    @property
    def distribution_cls(self):
        return gpytorch.variational.NaturalVariationalDistribution
