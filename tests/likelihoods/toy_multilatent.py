r"""A test-only two-latent likelihood, so that the multi-latent paths of the protocol suite (and of the
engines: latent-major potentials, batched CAVI strategies inside ``IndependentMultitaskVariationalStrategy``)
run before the first real multi-latent likelihood registers.

``TwoBitLogitLikelihood``: :math:`y\in\{0,1,2,3\}` encodes two independent logistic bits,
:math:`b_1 = y \bmod 2`, :math:`b_2 = \lfloor y/2\rfloor`, :math:`s_j = 2b_j-1`, and

.. math::
    p(y\mid f) = \sigma(s_1 f_1)\,\sigma(s_2 f_2),\qquad
    p(y,\omega\mid f) = \tfrac14 \prod_{j=1}^2 \exp\!\big(\tfrac{s_j}{2} f_j - \tfrac12\omega_j f_j^2\big)\,
    \mathrm{PG}(\omega_j\mid 1, 0),

i.e. the Bernoulli augmentation (docs/maths/binary.md) once per latent, with ``omega`` of shape ``(N, 2)``.
Per-latent auxiliaries are declared as ``Independent(..., 1)`` so that their log-density is one value per datum.
"""

from __future__ import annotations

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import Categorical, Independent
from torch.nn.functional import logsigmoid

from gpytorch_augment._numerics import LOG2, gauss_hermite, log_sigma_tilde_plus, pg_kl, pg_mean
from gpytorch_augment._validation import check_values_in
from gpytorch_augment.distributions import PolyaGamma
from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
from gpytorch_augment.likelihoods import AugmentedLikelihood
from gpytorch_augment.testing.case import LikelihoodCase, marginalise_single_pg

AuxDict = dict[str, Tensor]


class TwoBitLogitLikelihood(AugmentedLikelihood):
    """Two independent logistic bits packed in one label (test-only; see the module docstring)."""

    num_latents = 2

    def check_targets(self, y: Tensor, **kwargs) -> Tensor:
        check_values_in("labels y", y, (0.0, 1.0, 2.0, 3.0))
        return y

    @staticmethod
    def _signs(y: Tensor) -> Tensor:
        """(..., N) labels -> (..., N, 2) signs."""
        bits = torch.stack([torch.remainder(y, 2), torch.div(y, 2, rounding_mode="floor")], -1)
        return 2 * bits - 1

    def _moments(self, function_dist: MultivariateNormal) -> tuple[Tensor, Tensor]:
        return function_dist.mean, function_dist.variance  # (..., N, 2)

    # drop-in
    def forward(self, function_samples: Tensor, *args, **kwargs) -> Categorical:
        f1, f2 = function_samples[..., 0], function_samples[..., 1]
        logits = torch.stack(
            [logsigmoid(-f1) + logsigmoid(-f2), logsigmoid(f1) + logsigmoid(-f2),
             logsigmoid(-f1) + logsigmoid(f2), logsigmoid(f1) + logsigmoid(f2)], -1
        )
        return Categorical(logits=logits)

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs) -> Tensor:
        return logsigmoid(self._signs(y).to(f.dtype) * f).sum(-1)

    def expected_log_prob(self, observations, function_dist, *args, **kwargs) -> Tensor:
        y = self.check_observations(observations, function_dist, **kwargs)
        nodes, weights = gauss_hermite(*self._moments(function_dist), 32)  # additive in the latents: 1-D rules
        return (weights * logsigmoid(self._signs(y).to(nodes.dtype) * nodes)).sum(0).sum(-1)

    def _bit_probs(self, function_dist) -> Tensor:
        nodes, weights = gauss_hermite(*self._moments(function_dist), 32)
        return (weights * torch.sigmoid(nodes)).sum(0)  # (..., N, 2): P(b_j = 1)

    def log_marginal(self, observations, function_dist, *args, **kwargs) -> Tensor:
        y = self.check_observations(observations, function_dist, **kwargs)
        p1 = self._bit_probs(function_dist)
        bits = (self._signs(y) > 0).to(p1.dtype)
        return (bits * p1 + (1 - bits) * (1 - p1)).log().sum(-1)

    def marginal(self, function_dist, *args, **kwargs) -> Categorical:
        p1 = self._bit_probs(function_dist)
        a, b = p1[..., 0], p1[..., 1]
        return Categorical(probs=torch.stack([(1 - a) * (1 - b), a * (1 - b), (1 - a) * b, a * b], -1))

    # sampling side
    def aux_prior(self, y: Tensor) -> AuxiliaryDistribution:
        one = torch.ones((*y.shape, 2), dtype=y.dtype)
        return AuxiliaryDistribution(omega=Independent(PolyaGamma(one, torch.zeros_like(one)), 1))

    def aux_conditional(self, y: Tensor, f: Tensor) -> AuxiliaryDistribution:
        return AuxiliaryDistribution(omega=Independent(PolyaGamma(torch.ones_like(f), f.abs()), 1))

    def potential_and_precision(self, y, aux, f=None):
        omega = aux["omega"]
        h = (self._signs(y).to(omega.dtype) / 2).expand_as(omega)
        return h.mT, omega.mT

    def log_tilt_constant(self, y, aux):
        return torch.full_like(aux["omega"][..., 0], -2 * LOG2)

    # variational side
    def aux_posterior(self, y, f_mean, f_var) -> AuxDict:
        return {"c": (f_mean**2 + f_var).sqrt()}

    def expected_potential_and_precision(self, y, q_aux, f_mean, f_var):
        c = q_aux["c"]
        return (self._signs(y).to(c.dtype) / 2).expand_as(c).mT, pg_mean(1.0, c).mT

    def expected_log_tilt_constant(self, y, q_aux):
        return torch.full_like(q_aux["c"][..., 0], -2 * LOG2)

    def aux_kl(self, y, q_aux):
        return pg_kl(1.0, q_aux["c"]).sum(-1)

    def collapsed_bound(self, y, f_mean, f_var):
        return log_sigma_tilde_plus(self._signs(y).to(f_mean.dtype) * f_mean, (f_mean**2 + f_var).sqrt()).sum(-1)


def _two_bit_targets(f: Tensor, generator: torch.Generator, **kwargs) -> Tensor:
    bits = torch.bernoulli(torch.sigmoid(f), generator=generator)
    return bits[..., 0] + 2 * bits[..., 1]


def _two_bit_expected_log_lik(likelihood, y, m, s) -> Tensor:
    """log p is additive over the latents: one 100-node Gauss--Hermite rule per latent."""
    nodes, weights = gauss_hermite(m, s, 100)  # (100, ..., N, 2)
    signs = likelihood._signs(y).to(m.dtype)
    return (weights * logsigmoid(signs * nodes)).sum(0).sum(-1)


TWO_BIT_LOGIT = LikelihoodCase(
    name="toy_two_bit_logit",
    make=lambda: TwoBitLogitLikelihood().double(),
    sample_targets=_two_bit_targets,
    marginalise=marginalise_single_pg,
    q_aux_distribution=lambda lik, y, q: AuxiliaryDistribution(
        omega=Independent(PolyaGamma(torch.ones_like(q["c"]), q["c"]), 1)
    ),
    num_latents=2,
    expected_log_lik=_two_bit_expected_log_lik,
    # a self-test of the suite's multi-latent paths: fewer Monte-Carlo draws keep it cheap (same 5-SE rule)
    mc_samples=30_000,
    mc_kl_samples=10_000,
)

#: cases that test the suite itself (run by test_protocol.py next to the registered likelihoods)
SELF_TEST_CASES = [TWO_BIT_LOGIT]
