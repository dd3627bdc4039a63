r"""Any likelihood that is a Laplace transform of a quadratic in :math:`f`: the generic augmentation
(:doc:`/guide/writing_a_likelihood`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import Distribution

from .._numerics import quadrature_mixture
from .._validation import check_broadcasts, check_finite, checking_values
from ..distributions.auxiliary import AuxiliaryDistribution
from .augmented_likelihood import AugmentedLikelihood, AuxDict
from .mixing_laws import LaplaceTransformMixing, MixingLaw

__all__ = ["LaplaceTransformLikelihood"]

Coefficient = float | Tensor | Callable[[Tensor], Tensor]
_NAMES = ("log_c", "g", "alpha", "beta", "gamma")


class LaplaceTransformLikelihood(AugmentedLikelihood):
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
        elementwise: :meth:`forward` and the predictive :meth:`marginal` (Gauss--Hermite mixture) use it; without
        it they raise ``NotImplementedError`` (inference needs only the log-density, which :math:`\varphi` gives).
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
        if checking_values() and y.is_floating_point():
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
    def _target_distribution(self) -> Callable[[Tensor], Distribution]:
        if self.target_distribution is None:
            raise NotImplementedError(
                "this LaplaceTransformLikelihood has no target_distribution: pass target_distribution=f -> "
                "Distribution of y to draw targets or form the predictive (fitting needs only log_prob_at)"
            )
        return self.target_distribution

    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Distribution:
        """``target_distribution(f)``."""
        return self._target_distribution()(function_samples)

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        r""":math:`\log C + g f + \log\varphi(r(y, f))` (from :math:`\varphi`; ``target_distribution`` unused)."""
        log_c, g, alpha, beta, gamma = self.coefficients(y)
        return log_c + g * f + self.mixing.log_laplace(self._r(alpha, beta, gamma, f, f * f))

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> Distribution:
        r"""The predictive :math:`\sum_k w_k\,p(y\mid f_k)` over Gauss--Hermite nodes of :math:`q(f)`, with
        ``target_distribution``."""
        component = self._target_distribution()
        nodes, weights = self._quadrature(function_dist)
        return quadrature_mixture(nodes, weights, component)

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
