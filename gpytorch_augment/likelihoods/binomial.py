r"""Binomial likelihood with the logistic link, augmented with Pólya-Gamma variables."""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import Binomial, MixtureSameFamily

from .._numerics import LOG2, log_sigma_tilde_plus, pg_kl, pg_mean, pg_tilt_c, quadrature_mixture
from .._validation import check_broadcasts, check_counts, exact_float
from ..distributions.auxiliary import AuxiliaryDistribution
from ..distributions.polya_gamma import PolyaGamma
from ._count_predictive import CountPredictive
from .augmented_likelihood import AugmentedLikelihood, AuxDict


def _required_trials(trials: Tensor | float | None, dtype: torch.dtype | None = None) -> Tensor:
    if trials is None:
        raise ValueError(
            "BinomialLogitLikelihood needs the number of trials of every datum: pass trials=t "
            "(e.g. likelihood(f, trials=t), likelihood.expected_log_prob(y, q_f, trials=t), mll(output, y, trials=t))"
        )
    dtype = torch.get_default_dtype() if dtype is None else dtype
    trials = (
        exact_float("trials", trials, dtype) if isinstance(trials, Tensor) else torch.as_tensor(trials, dtype=dtype)
    )
    return check_counts("trials", trials)


def _log_binom(t: Tensor, y: Tensor) -> Tensor:
    return torch.lgamma(t + 1) - torch.lgamma(y + 1) - torch.lgamma(t - y + 1)


class BinomialLogitLikelihood(CountPredictive, AugmentedLikelihood):
    r"""Successes out of per-datum trials with the logistic link,
    :math:`p(y \mid f) = \binom{t}{y}\sigma(f)^y\sigma(-f)^{t-y}`, :math:`y \in \{0, \dots, t\}`.

    With :math:`\omega \sim \mathrm{PG}(t, 0)` the Pólya-Gamma identity gives

    .. math::
        p(y, \omega \mid f) = \binom ty 2^{-t} \exp\!\big((y - \tfrac t2) f - \tfrac12\omega f^2\big)\,
        \mathrm{PG}(\omega\mid t, 0), \qquad h = y - \tfrac t2,\quad \lambda = \omega,

    with full conditional :math:`\omega \mid f \sim \mathrm{PG}(t, |f|)` and, under
    :math:`q(f_i) = \mathcal N(m_i, s_i)`,
    optimal :math:`q(\omega_i) = \mathrm{PG}(t_i, c_i)`, :math:`c_i = \sqrt{m_i^2 + s_i}`, so
    :math:`\bar\lambda_i = \mathrm{PGm}(t_i, c_i)` and
    :math:`\ell^*_i = \log\binom{t_i}{y_i} + y_i\log\tilde\sigma^+(m_i, c_i)
    + (t_i - y_i)\log\tilde\sigma^+(-m_i, c_i)`.
    A datum with :math:`t_i = 0` carries no information: :math:`h = \lambda = 0`, KL :math:`= 0`, :math:`\ell^*_i = 0`.
    :math:`t = 1` is :class:`~gpytorch_augment.likelihoods.BernoulliLogitLikelihood`.

    **Trials.** The trials are per-datum data and travel as the keyword argument ``trials=`` (a tensor broadcastable
    to ``y``, or a number) through every public entry point: ``likelihood(f, trials=t)``,
    ``likelihood(model(x), trials=t)``, ``expected_log_prob(y, q_f, trials=t)``, ``log_marginal``,
    ``check_targets(y, trials=t)``, ``CAVI.step(x, y, trials=t)``, ``CAVI.fit(x, y, trials=t)`` and
    ``mll(output, y, trials=t)`` (``AugmentedELBO`` or GPyTorch's ``VariationalELBO``). Omitting them raises.
    :meth:`check_targets` binds them to the successes: it returns the **canonical target**
    ``torch.stack([y, t], dim=-2)`` of shape ``(*batch, 2, N)`` (row 0 the successes, row 1 the trials), and every
    protocol member (``aux_prior``, ``aux_posterior``, ``elbo_terms``, ``collapsed_bound``, ``log_prob_at``...) takes
    that canonical target as its ``y`` (:meth:`split_targets` undoes the stacking). The pair sits in the
    second-to-last dimension so that the last dimension still indexes the data (``target.shape[-1] == N``,
    ``target[..., idx]`` is a mini-batch) and leading dimensions are still batch dimensions (``target.expand(S,
    *target.shape)`` broadcasts against ``S`` latent draws). The likelihood itself holds no per-datum state.

    The auxiliary variables are ``{"omega": ω}``; their variational parameters ``{"c": c}``.

    Example::

        >>> import torch
        >>> from gpytorch.distributions import MultivariateNormal
        >>> from gpytorch_augment import BinomialLogitLikelihood
        >>> likelihood = BinomialLogitLikelihood()
        >>> q_f = MultivariateNormal(torch.zeros(2), torch.eye(2))
        >>> predictive = likelihood(q_f, trials=torch.tensor([4.0, 10.0]))
        >>> predictive.mean                                    # t* E σ(f*), = t*/2 by symmetry
        tensor([2., 5.])
        >>> likelihood.expected_log_prob(torch.tensor([1.0, 5.0]), q_f, trials=torch.tensor([4.0, 10.0])).shape
        torch.Size([2])
    """

    augmentation = "Pólya-Gamma"
    maths_page = "binary"

    @staticmethod
    def split_targets(target: Tensor) -> tuple[Tensor, Tensor]:
        """The successes and the trials of a canonical target (see :meth:`check_targets`)."""
        successes, trials = target.unbind(-2)
        return successes, trials

    def check_targets(self, y: Tensor, trials: Tensor | float | None = None, **kwargs: Any) -> Tensor:
        """Successes and trials must be finite non-negative integers with ``y <= trials``.

        :returns: the canonical target ``torch.stack([y, trials], dim=-2)``, shape ``(*batch, 2, N)``.
        """
        y = check_counts("successes y", y)
        trials = _required_trials(trials, y.dtype)
        if y.dim() == 0:
            raise ValueError("successes y must have shape (N,) (or (*batch, N)); got a scalar")
        try:
            y, trials = torch.broadcast_tensors(y, trials.to(y))
        except RuntimeError as err:
            raise ValueError(
                f"successes y of shape {tuple(y.shape)} and trials of shape {tuple(trials.shape)} do not match"
            ) from err
        too_many = y > trials
        if too_many.any():
            i = too_many.nonzero()[0].tolist()
            raise ValueError(
                f"successes y exceed the number of trials at index {i}: y = {y[tuple(i)].item()}, "
                f"trials = {trials[tuple(i)].item()}"
            )
        return torch.stack([y, trials], dim=-2)

    # ------------------------------------------------------------------ drop-in
    def forward(
        self, function_samples: Tensor, *args: Any, trials: Tensor | float | None = None, **kwargs: Any
    ) -> Binomial:
        r""":math:`\mathrm{Bin}(y \mid t, \sigma(f))` (``trials=`` required)."""
        return Binomial(
            total_count=_required_trials(trials, function_samples.dtype).to(function_samples), logits=function_samples
        )

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        successes, trials = self.split_targets(y)
        logsigmoid = torch.nn.functional.logsigmoid
        return _log_binom(trials, successes) + successes * logsigmoid(f) + (trials - successes) * logsigmoid(-f)

    def marginal(
        self, function_dist: MultivariateNormal, *args: Any, trials: Tensor | float | None = None, **kwargs: Any
    ) -> MixtureSameFamily:
        r""":math:`\sum_k w_k\,\mathrm{Bin}(y_* \mid t_*, \sigma(f_k))` (Gauss--Hermite); mean
        :math:`t_* E\sigma(f_*)`."""
        trials = _required_trials(trials, function_dist.mean.dtype).to(function_dist.mean)
        data_shape = function_dist.mean.shape
        if check_broadcasts("trials", trials, data_shape) != data_shape:
            raise ValueError(
                f"trials has shape {tuple(trials.shape)}, more dimensions than the data's shape "
                f"{tuple(data_shape)}: pass one count per datum"
            )
        trials = trials.unsqueeze(-1)
        nodes, weights = self._quadrature(function_dist)
        return quadrature_mixture(nodes, weights, lambda f: Binomial(total_count=trials, logits=f))

    # ------------------------------------------------------------------ sampling side
    def aux_prior(self, y: Tensor) -> AuxiliaryDistribution:
        _, trials = self.split_targets(y)
        return AuxiliaryDistribution(omega=PolyaGamma(trials, torch.zeros_like(trials)))

    def aux_conditional(self, y: Tensor, f: Tensor) -> AuxiliaryDistribution:
        _, trials = self.split_targets(y)
        return AuxiliaryDistribution(omega=PolyaGamma(trials, f.abs()))

    def potential_and_precision(self, y: Tensor, aux: AuxDict, f: Tensor | None = None) -> tuple[Tensor, Tensor]:
        successes, trials = self.split_targets(y)
        omega = aux["omega"]
        return (successes - trials / 2).expand_as(omega), omega

    def log_tilt_constant(self, y: Tensor, aux: AuxDict) -> Tensor:
        successes, trials = self.split_targets(y)
        return (_log_binom(trials, successes) - trials * LOG2).expand_as(aux["omega"])

    # ------------------------------------------------------------------ variational side
    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        return {"c": pg_tilt_c(f_mean, f_var)}

    def expected_potential_and_precision(
        self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor
    ) -> tuple[Tensor, Tensor]:
        successes, trials = self.split_targets(y)
        c = q_aux["c"]
        return (successes - trials / 2).expand_as(c), pg_mean(trials, c)

    def expected_log_tilt_constant(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        successes, trials = self.split_targets(y)
        return (_log_binom(trials, successes) - trials * LOG2).expand_as(q_aux["c"])

    def aux_kl(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        _, trials = self.split_targets(y)
        return pg_kl(trials, q_aux["c"])

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        successes, trials = self.split_targets(y)
        c = pg_tilt_c(f_mean, f_var)
        return (
            _log_binom(trials, successes)
            + successes * log_sigma_tilde_plus(f_mean, c)
            + (trials - successes) * log_sigma_tilde_plus(-f_mean, c)
        )
