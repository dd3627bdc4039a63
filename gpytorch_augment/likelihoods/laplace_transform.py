r"""Any likelihood that is a Laplace transform of a quadratic in :math:`f`: the generic augmentation
(:doc:`/guide/writing_a_likelihood`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import Bernoulli, Categorical, Distribution, constraints

from .._numerics import quadrature_mixture
from .._validation import check_broadcasts, check_finite
from ..distributions.auxiliary import AuxiliaryDistribution
from ._predictive import ContinuousPredictive
from .augmented_likelihood import AugmentedLikelihood, AuxDict
from .mixing_laws import LaplaceTransformMixing, MixingLaw

__all__ = ["LaplaceTransformLikelihood"]

Coefficient = float | Tensor | Callable[[Tensor], Tensor]
_NAMES = ("log_c", "g", "alpha", "beta", "gamma")
#: Gauss--Legendre nodes of the predictive CDF's integral over y (per latent node, on each side)
_CDF_NODES = 96


def _legendre(dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """Gauss--Legendre nodes and weights on (0, 1)."""
    import numpy as np

    x, w = np.polynomial.legendre.leggauss(_CDF_NODES)
    return (torch.as_tensor((x + 1) / 2, dtype=dtype, device=device),
            torch.as_tensor(w / 2, dtype=dtype, device=device))  # fmt: skip


class PhiConditional(Distribution):
    r""":math:`p(y\mid f)` of a :class:`LaplaceTransformLikelihood` from :math:`\varphi` alone: ``log_prob(y)`` is
    ``log_prob_at(y, f)``; no sampler and no moments (pass ``target_distribution`` for those).

    Example::

        >>> import torch
        >>> from gpytorch_augment.likelihoods import LaplaceTransformLikelihood
        >>> gaussian = LaplaceTransformLikelihood(lambda r: -r, log_c=-0.5 * torch.log(torch.tensor(2 * torch.pi)),
        ...     alpha=lambda y: y**2 / 2, beta=lambda y: y, gamma=0.5, real_valued_targets=True)
        >>> round(float(gaussian(torch.tensor([0.0])).log_prob(torch.tensor([0.0])).exp()), 6)  # N(0 | 0, 1)
        0.398942
    """

    arg_constraints: dict[str, Any] = {}
    support = constraints.real
    has_rsample = False

    def __init__(self, likelihood: LaplaceTransformLikelihood, f: Tensor) -> None:
        self.likelihood, self.f = likelihood, f
        super().__init__(batch_shape=f.shape, validate_args=False)

    def log_prob(self, value: Tensor) -> Tensor:
        return self.likelihood.log_prob_at(torch.as_tensor(value).to(self.f), self.f)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:  # noqa: B008
        raise NotImplementedError(
            "a LaplaceTransformLikelihood without target_distribution has no sampler of y: pass "
            "target_distribution=f -> Distribution of y to draw targets (prediction needs only log_prob_at)"
        )


class LaplaceTransformLikelihood(ContinuousPredictive, AugmentedLikelihood):
    r"""The likelihood of any model of the form

    .. math::
        p(y\mid f) = C(y)\, e^{g(y) f}\, \varphi\big(r(y, f)\big), \qquad r(y, f) = \alpha(y) - \beta(y) f +
        \gamma(y) f^2 \ge 0, \qquad \varphi(r) = \int_0^\infty e^{-r\omega}\,p(\omega)\,d\omega,

    where :math:`\varphi` is the Laplace transform of a *mixing law* :math:`p(\omega)` on :math:`\omega > 0`
    (a completely monotone function, by Bernstein's theorem). Writing :math:`\varphi(r)` as the integral makes
    the likelihood conditionally Gaussian in :math:`f` (:doc:`/guide/writing_a_likelihood` has the derivation):

    .. math::
        p(y, \omega\mid f) = C\,e^{-\alpha\omega}\exp\big((g + \beta\omega) f - \tfrac12 (2\gamma\omega) f^2\big)
        \,p(\omega), \qquad h = g + \beta\omega,\quad \lambda = 2\gamma\omega,\quad \log C(\omega) = \log C -
        \alpha\omega .

    * Gibbs: :math:`\omega\mid y, f \sim p_r(\omega) \propto e^{-r\omega}p(\omega)`, :math:`r = r(y, f)`, drawn
      exactly for the known families of :mod:`~gpytorch_augment.likelihoods.mixing_laws` (Pólya-Gamma, Gamma,
      inverse Gaussian) and otherwise by numerical inversion of :math:`s\mapsto\varphi(r+s)/\varphi(r)`
      (:class:`~gpytorch_augment.distributions.TiltedLaplaceTransform`).
    * CAVI: :math:`q(\omega_i) = p_{\tilde r_i}`, :math:`\tilde r_i = \alpha - \beta m_i + \gamma(m_i^2 + s_i)`;
      :math:`E_q\omega = -(\log\varphi)'(\tilde r)` (closed form for the families, else autograd),
      :math:`\mathrm{KL}(q\Vert p) = -\tilde r E_q\omega - \log\varphi(\tilde r)` and
      :math:`\ell^*_i = \log C + g m_i + \log\varphi(\tilde r_i)`.

    The name says what defines the model: the Laplace transform :math:`\varphi` of its mixing law (not the
    Laplace *distribution*, :class:`~gpytorch_augment.LaplaceLikelihood`, which is one instance). ``q_aux`` stores
    ``{"r": r̃}``; :math:`q(\omega)` is formed with the current constants of the mixing law.

    Example (the Bernoulli-logit likelihood: :math:`\sigma(s f) = \tfrac12 e^{sf/2}\cosh^{-1}(f/2)`,
    :math:`\varphi` the Pólya-Gamma transform at :math:`r = f^2/2`)::

        >>> import math, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood
        >>> from gpytorch_augment.likelihoods import LaplaceTransformLikelihood, PolyaGammaMixing
        >>> logit = LaplaceTransformLikelihood(
        ...     PolyaGammaMixing(), log_c=-math.log(2), g=lambda y: y - 0.5, gamma=0.5,
        ...     target_distribution=lambda f: torch.distributions.Bernoulli(logits=f)).double()
        >>> y = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
        >>> f = torch.tensor([0.3, -2.0, 1.5], dtype=torch.float64)
        >>> torch.allclose(logit.log_prob_at(y, f), BernoulliLogitLikelihood().log_prob_at(y, f))
        True
        >>> m, s = f, torch.full_like(f, 0.5)
        >>> torch.allclose(logit.collapsed_bound(y, m, s), BernoulliLogitLikelihood().collapsed_bound(y, m, s))
        True

    :param mixing: the mixing law: a :class:`~gpytorch_augment.likelihoods.MixingLaw` (a known family or
        :class:`~gpytorch_augment.likelihoods.LaplaceTransformMixing`), or a callable :math:`r\mapsto\log\varphi(r)`
        (wrapped in ``LaplaceTransformMixing`` and checked).
    :param log_c: :math:`\log C(y)`; like the four below, a number, a tensor broadcasting against the targets, or
        a callable ``y -> tensor`` (a ``torch.nn.Module`` is registered, so its parameters are learnt). A subclass
        may instead override :meth:`coefficients` (e.g. to tie them to one learnable constant).
    :param g: :math:`g(y)`.
    :param alpha: :math:`\alpha(y)`.
    :param beta: :math:`\beta(y)`.
    :param gamma: :math:`\gamma(y) \ge 0`, with :math:`\beta^2 \le 4\alpha\gamma` so that :math:`r \ge 0` for
        every :math:`f` (checked on the targets).
    :param target_distribution: optional ``f -> torch.distributions.Distribution`` of :math:`y` given :math:`f`,
        elementwise, used by :meth:`forward` and :meth:`marginal` in place of the predictive from :math:`\varphi`
        (needed only to draw targets). Without it the predictive comes from :math:`\varphi` itself, as the
        built-in likelihoods': with ``num_classes`` a ``Bernoulli`` (2 classes) or ``Categorical`` whose
        ``.probs`` are the class probabilities :math:`E_{q(f)} p(y = k\mid f)`; with ``real_valued_targets`` a
        Gauss--Hermite mixture of :class:`PhiConditional` with ``log_prob``, and :meth:`predictive_cdf`,
        ``predictive_quantile`` and ``predictive_interval`` (by the bisection the built-ins use); otherwise a
        mixture with ``log_prob`` only.
    :param num_classes: for class labels :math:`y \in \{0, \dots, K-1\}` (e.g. 2 for a binary likelihood): the
        number :math:`K` of classes, which makes the predictive a ``Bernoulli`` / ``Categorical``.
    :param target_check: optional ``y -> y`` that validates targets (raising ``ValueError``) and returns them in
        the form the coefficients expect; the default checks finiteness.
    :param real_valued_targets: whether the targets are real values the latent must match (regression).
    :raises ValueError: naming the argument: a ``log_phi`` that is not a Laplace transform, a coefficient that is
        neither a number, a tensor nor a callable.
    """

    def __init__(
        self,
        mixing: MixingLaw | Callable[[Tensor], Tensor],
        *,
        log_c: Coefficient = 0.0,
        g: Coefficient = 0.0,
        alpha: Coefficient = 0.0,
        beta: Coefficient = 0.0,
        gamma: Coefficient = 0.5,
        target_distribution: Callable[[Tensor], Distribution] | None = None,
        target_check: Callable[[Tensor], Tensor] | None = None,
        real_valued_targets: bool = False,
        num_classes: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(mixing, MixingLaw):
            if not callable(mixing):
                raise ValueError(f"mixing must be a MixingLaw or a callable r -> log phi(r); got {mixing!r}")
            mixing = LaplaceTransformMixing(mixing)
        self.mixing = mixing
        self._callables: dict[str, Callable[[Tensor], Tensor]] = {}
        for name, value in zip(_NAMES, (log_c, g, alpha, beta, gamma)):
            if isinstance(value, torch.nn.Module):
                self.add_module(f"{name}_module", value)
                self._callables[name] = value
            elif callable(value):
                self._callables[name] = value
            else:
                try:
                    tensor = torch.as_tensor(value, dtype=torch.get_default_dtype())
                except (TypeError, ValueError, RuntimeError) as error:
                    message = f"{name} must be a number, a tensor or a callable y -> tensor; got {value!r}"
                    raise ValueError(message) from error
                if not bool(torch.isfinite(tensor).all()):
                    raise ValueError(f"{name} must be finite; got {value!r}")
                if name == "gamma" and bool((tensor < 0).any()):
                    raise ValueError(f"gamma must be >= 0 (the precision 2 gamma omega is >= 0); got {value!r}")
                self.register_buffer(f"_{name}", tensor.clone())
        self.target_distribution = target_distribution
        self.target_check = target_check
        self.real_valued_targets = bool(real_valued_targets)
        if num_classes is not None:
            if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
                raise ValueError(
                    f"num_classes must be an integer >= 2 (the class labels are 0..K-1); got {num_classes!r}"
                )
            if self.real_valued_targets:
                raise ValueError("num_classes and real_valued_targets=True exclude each other")
        self.num_classes = num_classes

    # ------------------------------------------------------------------ the model
    def coefficients(self, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        r""":math:`(\log C + \log\varphi(0), g, \alpha, \beta, \gamma)` at the canonical targets ``y`` (the mass
        :math:`\varphi(0)` of an unnormalised transform is folded into :math:`\log C`).

        :raises ValueError: naming a coefficient whose value does not broadcast against ``y`` without adding
            dimensions."""
        values = []
        for name in _NAMES:
            value = self._callables[name](y) if name in self._callables else getattr(self, f"_{name}")
            value = torch.as_tensor(value)
            value = value.to(y.dtype if y.is_floating_point() else value.dtype)
            hint = f"{name} must be a number or give one value per target"
            if check_broadcasts(name, value, y.shape, hint) != y.shape:
                raise ValueError(
                    f"{name} has shape {tuple(value.shape)}, more dimensions than the targets' shape {tuple(y.shape)}: "
                    f"{name}(y) must give one value per target (or broadcast against them)"
                )
            values.append(value)
        values[0] = values[0] + self.mixing.log_mass()
        return tuple(values)  # type: ignore[return-value]

    def _r(self, alpha: Tensor, beta: Tensor, gamma: Tensor, f: Tensor, f2: Tensor) -> Tensor:
        """:math:`\\alpha - \\beta f + \\gamma f^2` (``f2`` is :math:`f^2` or :math:`m^2 + s`), clamped at 0 against
        rounding."""
        return (alpha - beta * f + gamma * f2).clamp_min(0.0)

    def check_targets(self, y: Tensor, **kwargs: Any) -> Tensor:
        r"""``target_check(y)`` (default: finite), then finite coefficients, :math:`\gamma \ge 0` and
        :math:`\beta^2 \le 4\alpha\gamma` at these targets (else :math:`r(y, f)` is negative for some :math:`f`).

        :raises ValueError: naming the coefficient that breaks a rule."""
        y = self.target_check(y) if self.target_check is not None else check_finite("targets y", y)
        if y.is_floating_point():
            with torch.no_grad():
                coefficients = self.coefficients(y)
                for name, value in zip(_NAMES, coefficients):
                    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                        bad = value[~torch.isfinite(value)].flatten()[0].item()
                        raise ValueError(
                            f"{name} gives non-finite values at these targets (e.g. {bad}): every coefficient must "
                            "be finite at every target"
                        )
                _, _, alpha, beta, gamma = coefficients
                if bool((gamma < 0).any()):
                    raise ValueError(f"gamma(y) must be >= 0; got {gamma.min().item()}")
                excess = beta**2 - 4 * alpha * gamma
                rounding = 64 * torch.finfo(excess.dtype).eps  # a perfect square, rounded in float32 or float64
                if bool((excess > rounding * (beta**2 + (4 * alpha * gamma).abs() + 1)).any()):
                    raise ValueError(
                        "beta(y)^2 <= 4 alpha(y) gamma(y) is needed for r = alpha - beta f + gamma f^2 >= 0 at every "
                        f"f; it fails by {excess.max().item():.3g}"
                    )
        return y

    # ------------------------------------------------------------------ drop-in
    def _target_distribution(self) -> Callable[[Tensor], Distribution] | None:
        r"""``target_distribution`` (a subclass may return its own family); ``None``: the predictive from
        :math:`\varphi`."""
        return self.target_distribution

    def _class_probs(self, f: Tensor, weights: Tensor | None = None) -> Tensor:
        r""":math:`p(y = k\mid f)` for every class, stacked last (averaged over the node dimension 0 with
        ``weights``)."""
        labels = torch.arange(int(self.num_classes), dtype=f.dtype, device=f.device)  # type: ignore[arg-type]
        shape = (-1,) + (1,) * f.dim()
        probs = self.log_prob_at(labels.view(shape), f.unsqueeze(0)).exp()  # (K, *f.shape)
        if weights is not None:
            probs = (weights.unsqueeze(0) * probs).sum(1)
        return probs.movedim(0, -1).clamp(0.0, 1.0)

    def _from_probs(self, probs: Tensor) -> Distribution:
        if probs.shape[-1] == 2:
            return Bernoulli(probs=probs[..., 1])
        return Categorical(probs=probs)

    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Distribution:
        r"""``target_distribution(f)``, else :math:`p(y\mid f)` from :math:`\varphi`: a ``Bernoulli`` /
        ``Categorical`` with ``num_classes``, a :class:`PhiConditional` otherwise."""
        component = self._target_distribution()
        if component is not None:
            return component(function_samples)
        if self.num_classes is not None:
            return self._from_probs(self._class_probs(function_samples))
        return PhiConditional(self, function_samples)

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        r""":math:`\log C + g f + \log\varphi(r(y, f))` (from :math:`\varphi`; ``target_distribution`` unused)."""
        log_c, g, alpha, beta, gamma = self.coefficients(y)
        return log_c + g * f + self.mixing.log_laplace(self._r(alpha, beta, gamma, f, f * f))

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> Distribution:
        r"""The predictive :math:`\sum_k w_k\,p(y\mid f_k)` over Gauss--Hermite nodes of :math:`q(f)`: with
        ``target_distribution`` its mixture; else with ``num_classes`` a ``Bernoulli`` (``.probs`` =
        :math:`P(y_* = 1)`) or ``Categorical`` (``.probs`` ``(..., N, K)``), otherwise a mixture of
        :class:`PhiConditional` (``log_prob``; quantiles by :meth:`predictive_quantile`)."""
        nodes, weights = self._quadrature(function_dist)
        component = self._target_distribution()
        if component is not None:
            return quadrature_mixture(nodes, weights, component)
        if self.num_classes is not None:
            return self._from_probs(self._class_probs(nodes, weights.expand_as(nodes)))
        return quadrature_mixture(nodes, weights, lambda f: PhiConditional(self, f))

    # ------------------------------------------------------------------ predictive quantiles (real-valued targets)
    def _check_real_valued(self) -> None:
        if not self.real_valued_targets:
            raise ValueError(
                "predictive_cdf/predictive_quantile/predictive_interval need real_valued_targets=True (a density in "
                "y); a likelihood with num_classes has class probabilities: likelihood(q_f).probs"
            )

    @torch.no_grad()
    def predictive_cdf(self, function_dist: MultivariateNormal, value: Tensor | float, **kwargs: Any) -> Tensor:
        r""":math:`P(y_* \le v)` under :meth:`marginal` (float64, shape ``(..., N)``), for ``real_valued_targets``:
        :math:`\sum_k w_k F(v\mid f_k)` over Gauss--Hermite nodes, each :math:`F(v\mid f_k)` integrated from
        :math:`\varphi` by Gauss--Legendre on the side of :math:`v` away from :math:`f_k`
        (:math:`y = v \mp s_k\,u/(1-u)`, :math:`s_k = 1/p(f_k\mid f_k)`).

        :raises ValueError: without ``real_valued_targets``.
        """
        return self._cdf_function(function_dist)(torch.as_tensor(value))

    def _cdf_function(self, function_dist: MultivariateNormal, **kwargs: Any) -> Callable[[Tensor], Tensor]:
        self._check_real_valued()
        mean = function_dist.mean.detach().double()
        nodes, weights = self._quadrature(
            MultivariateNormal(mean, torch.diag_embed(function_dist.variance.detach().double().clamp_min(1e-300)))
        )
        scale = (-self.log_prob_at(nodes, nodes)).exp().clamp_min(1e-300)  # (nodes, ..., N)
        u, w_u = _legendre(torch.float64, mean.device)
        shape = (-1,) + (1,) * nodes.dim()
        t, jac = (u / (1 - u)).view(shape), (w_u / (1 - u) ** 2).view(shape)

        def cdf(value: Tensor) -> Tensor:
            v = torch.as_tensor(value, dtype=torch.float64, device=mean.device).expand_as(mean)
            left = v <= nodes  # integrate (-inf, v] where v lies left of the node, else 1 - [v, inf)
            sign = torch.where(left, -1.0, 1.0)
            y = v + sign * scale * t  # (L, nodes, ..., N)
            tail = (jac * scale * self.log_prob_at(y, nodes.unsqueeze(0)).exp()).sum(0).clamp(0.0, 1.0)
            per_node = torch.where(left, tail, 1 - tail)
            return (weights * per_node).sum(0).clamp(0.0, 1.0)

        return cdf

    def _quantile_bracket(self, function_dist: MultivariateNormal, **kwargs: Any) -> tuple[Tensor, Tensor]:
        self._check_real_valued()
        mean = function_dist.mean.detach().double()
        scale = (-self.log_prob_at(mean, mean)).exp()
        return mean, (function_dist.variance.detach().double().clamp_min(0) + scale**2).sqrt()

    # ------------------------------------------------------------------ sampling side
    def aux_prior(self, y: Tensor) -> AuxiliaryDistribution:
        like = y if y.is_floating_point() else y.to(torch.get_default_dtype())
        return AuxiliaryDistribution(omega=self.mixing.prior(like))

    def aux_conditional(self, y: Tensor, f: Tensor) -> AuxiliaryDistribution:
        _, _, alpha, beta, gamma = self.coefficients(y)
        return AuxiliaryDistribution(omega=self.mixing.tilted(self._r(alpha, beta, gamma, f, f * f)))

    def sample_aux(self, y: Tensor, f: Tensor, generator: torch.Generator | None = None) -> AuxDict:
        r""":math:`\omega\sim p_{r(y,f)}`, drawn by the mixing law (exact family sampler or inversion)."""
        with torch.no_grad():
            _, _, alpha, beta, gamma = self.coefficients(y)
            r = self._r(alpha, beta, gamma, f, f * f)
            return {"omega": self.mixing.sample_tilted(r.expand_as(f), generator=generator)}

    def potential_and_precision(self, y: Tensor, aux: AuxDict, f: Tensor | None = None) -> tuple[Tensor, Tensor]:
        omega = aux["omega"]
        _, g, _, beta, gamma = self.coefficients(y)
        return (g + beta * omega).expand_as(omega), (2 * gamma * omega).expand_as(omega)

    def log_tilt_constant(self, y: Tensor, aux: AuxDict) -> Tensor:
        log_c, _, alpha, _, _ = self.coefficients(y)
        return (log_c - alpha * aux["omega"]).expand_as(aux["omega"])

    def log_tilt(self, y: Tensor, aux: AuxDict, f: Tensor) -> Tensor:
        r""":math:`\log C + g f - \omega\, r(y, f)` (the same quadratic, without expanding it)."""
        log_c, g, alpha, beta, gamma = self.coefficients(y)
        return log_c + g * f - aux["omega"] * self._r(alpha, beta, gamma, f, f * f)

    # ------------------------------------------------------------------ variational side
    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        _, _, alpha, beta, gamma = self.coefficients(y)
        return {"r": self._r(alpha, beta, gamma, f_mean, f_mean**2 + f_var).expand_as(f_mean)}

    def aux_posterior_distribution(self, y: Tensor, q_aux: AuxDict) -> AuxiliaryDistribution:
        r"""The law of :math:`q(\omega) = p_{\tilde r}` for the parameters ``q_aux``."""
        return AuxiliaryDistribution(omega=self.mixing.tilted(q_aux["r"]))

    def expected_potential_and_precision(
        self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor
    ) -> tuple[Tensor, Tensor]:
        _, g, _, beta, gamma = self.coefficients(y)
        mean = self.mixing.tilted_mean(q_aux["r"])
        return (g + beta * mean).expand_as(mean), (2 * gamma * mean).expand_as(mean)

    def expected_log_tilt_constant(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        log_c, _, alpha, _, _ = self.coefficients(y)
        return log_c - alpha * self.mixing.tilted_mean(q_aux["r"])

    def expected_log_tilt(self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor) -> Tensor:
        log_c, g, alpha, beta, gamma = self.coefficients(y)
        r = self._r(alpha, beta, gamma, f_mean, f_mean**2 + f_var)
        return log_c + g * f_mean - self.mixing.tilted_mean(q_aux["r"]) * r

    def aux_kl(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        r""":math:`\mathrm{KL}(p_{\tilde r}\Vert p) = -\tilde r\,E_{p_{\tilde r}}\omega - \log\varphi(\tilde r)`."""
        r = q_aux["r"]
        log_phi, mean = self.mixing.log_laplace_and_mean(r)
        return -r * mean - log_phi

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        r""":math:`\ell^* = \log C + g m + \log\varphi(\tilde r)`."""
        log_c, g, alpha, beta, gamma = self.coefficients(y)
        return log_c + g * f_mean + self.mixing.log_laplace(self._r(alpha, beta, gamma, f_mean, f_mean**2 + f_var))
