r"""Ordinal regression with the cumulative-logit link, augmented with two Pólya-Gamma variables per datum
(:doc:`/maths/ordinal`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import Categorical
from torch.nn.functional import logsigmoid, softplus

from .._numerics import LOG2, log1mexp, log_sigma_tilde_plus, pg_kl, pg_mean, pg_tilt_c
from .._validation import check_class_labels, check_integer
from ..distributions.auxiliary import AuxiliaryDistribution
from ..distributions.polya_gamma import PolyaGamma
from .augmented_likelihood import AugmentedLikelihood, AuxDict

__all__ = ["OrdinalLogitLikelihood"]


def _inverse_softplus(x: Tensor) -> Tensor:
    """:math:`\\log(e^x - 1)` for :math:`x > 0`, stable for large and small ``x``."""
    return x + torch.log(-torch.expm1(-x))


class OrdinalLogitLikelihood(AugmentedLikelihood):
    r"""Ordered classes :math:`y \in \{0, \dots, K-1\}` with the cumulative-logit (proportional-odds) link and
    learnable cut-points :math:`b_1 < \dots < b_{K-1}` (:math:`b_0 = -\infty`, :math:`b_K = +\infty`):

    .. math::
        p(y = k \mid f) = \sigma(b_{k+1} - f) - \sigma(b_k - f)
        = \sigma(b_{k+1} - f)\,\sigma(f - b_k)\,\big(1 - e^{b_k - b_{k+1}}\big),

    (class :math:`k` lies between the cut-points :math:`b_k` below and :math:`b_{k+1}` above; the last factor does
    not involve :math:`f`; the lowest class keeps only :math:`\sigma(b_1 - f)`, the highest only
    :math:`\sigma(f - b_{K-1})`). Each logistic factor is augmented with its own Pólya-Gamma variable, by
    :math:`\sigma(z) = \tfrac12 e^{z/2}\int e^{-\omega z^2/2}\,\mathrm{PG}(\omega\mid1, 0)\,d\omega`. With the
    indicators :math:`n_u = [k < K-1]` and :math:`n_l = [k > 0]` of the upper and lower factor, the upper cut
    :math:`b_u = b_{k+1}` and the lower cut :math:`b_l = b_k`:

    .. math::
        p(y, \omega_u, \omega_l \mid f) = C\,\exp\!\big(h f - \tfrac12\lambda f^2\big)\,
        \mathrm{PG}(\omega_u\mid n_u, 0)\,\mathrm{PG}(\omega_l\mid n_l, 0),\qquad
        h = n_u(\omega_u b_u - \tfrac12) + n_l(\omega_l b_l + \tfrac12),\quad \lambda = n_u\omega_u + n_l\omega_l,

    .. math::
        \log C = n_u\big(\tfrac{b_u}2 - \tfrac{\omega_u b_u^2}2\big) + n_l\big(-\tfrac{b_l}2 - \tfrac{\omega_l
        b_l^2}2\big) - (n_u + n_l)\log 2 + n_u n_l \log\big(1 - e^{b_l - b_u}\big)

    (:math:`\mathrm{PG}(0, \cdot)` is the point mass at 0: an absent factor has no variable).

    * Gibbs: :math:`\omega_u \mid f \sim \mathrm{PG}(n_u, |b_u - f|)`, :math:`\omega_l \mid f \sim
      \mathrm{PG}(n_l, |f - b_l|)`.
    * CAVI: under :math:`q(f_i) = \mathcal N(m_i, s_i)`, :math:`q(\omega_u) = \mathrm{PG}(n_u, c_u)` with
      :math:`c_u = \sqrt{(b_u - m)^2 + s}`, :math:`q(\omega_l) = \mathrm{PG}(n_l, c_l)` with :math:`c_l = \sqrt{(m -
      b_l)^2 + s}`, and :math:`\ell^*_i = n_u\log\tilde\sigma^+(b_u - m, c_u) + n_l\log\tilde\sigma^+(m - b_l, c_l) +
      n_u n_l\log(1 - e^{b_l - b_u})`.
    * Cut-points: :math:`b_1` = ``raw_cutpoints[0]``, :math:`b_{k+1} = b_k + \mathrm{softplus}(\text{raw}_k)`, so
      any raw value keeps them ordered; they are learnt with the kernel hyper-parameters by
      ``CAVI(...).fit(x, y, learn_hyperparameters=True)`` (or any GPyTorch loop on the ELBO). A constant prior mean
      and :math:`b_1` are confounded: use a zero mean (or fix ``learn_cutpoints=False``).
    * Predictive: :meth:`marginal` is the ``Categorical`` with :math:`p(y_* = k) = E_{q(f_*)}p(y_* = k\mid f_*)`
      (Gauss--Hermite).

    The auxiliary variables are ``{"omega_upper": ω_u, "omega_lower": ω_l}``; their variational parameters
    ``{"c_upper": c_u, "c_lower": c_l}``.

    Example::

        >>> import torch
        >>> from gpytorch_augment import CAVI, OrdinalLogitLikelihood
        >>> from gpytorch_augment.testing import make_cavi_model
        >>> x = torch.linspace(-3, 3, 12, dtype=torch.float64).unsqueeze(-1)
        >>> y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2], dtype=torch.float64)
        >>> likelihood = OrdinalLogitLikelihood(num_classes=3, cutpoints=[-1.0, 1.0]).double()
        >>> model = make_cavi_model(1, x[::2]).double()
        >>> trace = CAVI(model, likelihood, num_data=12).fit(x, y, max_iter=50)
        >>> probs = likelihood(model(torch.tensor([[-3.0], [3.0]], dtype=torch.float64))).probs
        >>> probs.argmax(-1).tolist(), bool(torch.allclose(probs.sum(-1), torch.ones(2, dtype=torch.float64)))
        ([0, 2], True)

    :param num_classes: :math:`K \ge 2`.
    :param cutpoints: the initial :math:`b_1 < \dots < b_{K-1}` (default: evenly spaced in :math:`[-1, 1]`, 0 for
        :math:`K = 2`).
    :param learn_cutpoints: whether the cut-points are parameters that hyper-parameter fits learn.
    :raises ValueError: for ``num_classes`` < 2 or cut-points that are not finite, strictly increasing and
        ``K - 1`` in number.
    """

    augmentation = "two Pólya-Gamma per datum (cumulative logit, ordered cut-points)"
    maths_page = "ordinal"

    def __init__(
        self,
        num_classes: int,
        cutpoints: Sequence[float] | Tensor | None = None,
        learn_cutpoints: bool = True,
    ) -> None:
        super().__init__()
        num_classes = check_integer("num_classes", num_classes, 2)
        self.num_classes = int(num_classes)
        if cutpoints is None:
            cutpoints = torch.linspace(-1.0, 1.0, self.num_classes - 1) if self.num_classes > 2 else torch.zeros(1)
        self.register_parameter(
            "raw_cutpoints", torch.nn.Parameter(torch.zeros(self.num_classes - 1), requires_grad=bool(learn_cutpoints))
        )
        self.cutpoints = cutpoints

    # ------------------------------------------------------------------ cut-points
    @property
    def cutpoints(self) -> Tensor:
        r"""The ordered cut-points :math:`b_1 < \dots < b_{K-1}`, shape ``(K - 1,)``."""
        raw = self.raw_cutpoints
        return torch.cat([raw[..., :1], raw[..., :1] + softplus(raw[..., 1:]).cumsum(-1)], -1)

    @cutpoints.setter
    def cutpoints(self, value: Sequence[float] | Tensor) -> None:
        b = torch.as_tensor(value, dtype=torch.float64).detach().cpu()
        if b.shape != (self.num_classes - 1,):
            raise ValueError(
                f"cutpoints must hold K - 1 = {self.num_classes - 1} values, got shape {tuple(b.shape)}"
            )
        if not bool(torch.isfinite(b).all()) or not bool((b[1:] > b[:-1]).all()):
            raise ValueError(f"cutpoints must be finite and strictly increasing, got {b.tolist()}")
        raw = torch.cat([b[:1], _inverse_softplus(b[1:] - b[:-1])])
        with torch.no_grad():
            self.raw_cutpoints.copy_(raw.to(self.raw_cutpoints))

    def _bounds(self, y: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        r"""``(b_u, b_l, n_u, n_l)`` per datum: the upper and lower cut of each class (0 where absent, so that
        masked products stay finite) and the indicators of the two factors."""
        b = self.cutpoints.to(dtype)
        zero = b.new_zeros(b.shape[:-1] + (1,))
        k = y.long()
        upper, lower = torch.cat([b, zero])[k], torch.cat([zero, b])[k]
        n_u = (y < self.num_classes - 1).to(dtype)
        n_l = (y > 0).to(dtype)
        return upper, lower, n_u, n_l

    def _log_gap(self, upper: Tensor, lower: Tensor, n_u: Tensor, n_l: Tensor) -> Tensor:
        r""":math:`n_u n_l \log(1 - e^{b_l - b_u})`.

        Where a factor is absent its padded cut is 0, so :math:`b_l - b_u` may be 0 there (a first or last cut-point
        of exactly 0); the argument is replaced by -1 before :func:`log1mexp` so that neither the value nor the
        gradient of the discarded branch is infinite (``where`` would otherwise pass ``0 * inf = NaN`` back).
        """
        both = n_u * n_l > 0
        gap = torch.where(both, lower - upper, torch.full_like(upper, -1.0))
        return torch.where(both, log1mexp(gap), torch.zeros_like(upper))

    def check_targets(self, y: Tensor, **kwargs: Any) -> Tensor:
        """Labels must be integer class indices in ``0..K-1``; returned as floats."""
        return check_class_labels(y, self.num_classes)

    # ------------------------------------------------------------------ drop-in
    def class_log_probs(self, f: Tensor) -> Tensor:
        r""":math:`\log p(y = k \mid f)` for every class, shape ``(..., N, K)``."""
        labels = torch.arange(self.num_classes, dtype=f.dtype, device=f.device)
        return self.log_prob_at(labels, f.unsqueeze(-1))

    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Categorical:
        r"""The ``Categorical`` :math:`p(y \mid f)` over the :math:`K` ordered classes."""
        return Categorical(logits=self.class_log_probs(function_samples))

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        upper, lower, n_u, n_l = self._bounds(y, f.dtype)
        return (
            n_u * logsigmoid(upper - f) + n_l * logsigmoid(f - lower) + self._log_gap(upper, lower, n_u, n_l)
        )

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> Categorical:
        r""":math:`p(y_* = k) = E_{q(f_*)} p(y_* = k \mid f_*)` by Gauss--Hermite quadrature, shape ``(..., N, K)``."""
        nodes, weights = self._quadrature(function_dist)
        probs = (weights.unsqueeze(-1) * self.class_log_probs(nodes).exp()).sum(0)
        return Categorical(probs=probs / probs.sum(-1, keepdim=True))

    # ------------------------------------------------------------------ sampling side
    def aux_prior(self, y: Tensor) -> AuxiliaryDistribution:
        dtype = y.dtype if y.is_floating_point() else torch.get_default_dtype()
        _, _, n_u, n_l = self._bounds(y, dtype)
        return AuxiliaryDistribution(
            omega_upper=PolyaGamma(n_u, torch.zeros_like(n_u)), omega_lower=PolyaGamma(n_l, torch.zeros_like(n_l))
        )

    def aux_conditional(self, y: Tensor, f: Tensor) -> AuxiliaryDistribution:
        upper, lower, n_u, n_l = self._bounds(y, f.dtype)
        shape = torch.broadcast_shapes(f.shape, n_u.shape)
        return AuxiliaryDistribution(
            omega_upper=PolyaGamma(n_u.expand(shape), (upper - f).abs().expand(shape)),
            omega_lower=PolyaGamma(n_l.expand(shape), (f - lower).abs().expand(shape)),
        )

    def sample_aux(self, y: Tensor, f: Tensor, generator: torch.Generator | None = None) -> AuxDict:
        r""":math:`\omega_u \sim \mathrm{PG}(n_u, |b_u - f|)`, :math:`\omega_l \sim \mathrm{PG}(n_l, |f - b_l|)`,
        drawn directly from ``generator``."""
        with torch.no_grad():
            upper, lower, n_u, n_l = self._bounds(y, f.dtype)
            shape = torch.broadcast_shapes(f.shape, n_u.shape)
            draw = {}
            for name, n, z in (("omega_upper", n_u, upper - f), ("omega_lower", n_l, f - lower)):
                pg = PolyaGamma(n.expand(shape).contiguous(), z.abs().expand(shape).contiguous(), validate_args=False)
                draw[name] = pg.sample(generator=generator)
            return draw

    def potential_and_precision(self, y: Tensor, aux: AuxDict, f: Tensor | None = None) -> tuple[Tensor, Tensor]:
        omega_u, omega_l = aux["omega_upper"], aux["omega_lower"]
        upper, lower, n_u, n_l = self._bounds(y, omega_u.dtype)
        h = n_u * (omega_u * upper - 0.5) + n_l * (omega_l * lower + 0.5)
        return h, n_u * omega_u + n_l * omega_l

    def log_tilt_constant(self, y: Tensor, aux: AuxDict) -> Tensor:
        omega_u, omega_l = aux["omega_upper"], aux["omega_lower"]
        upper, lower, n_u, n_l = self._bounds(y, omega_u.dtype)
        return (
            n_u * (upper / 2 - omega_u * upper**2 / 2 - LOG2)
            + n_l * (-lower / 2 - omega_l * lower**2 / 2 - LOG2)
            + self._log_gap(upper, lower, n_u, n_l)
        )

    # ------------------------------------------------------------------ variational side
    def aux_posterior(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> AuxDict:
        upper, lower, _, _ = self._bounds(y, f_mean.dtype)
        return {"c_upper": pg_tilt_c(upper - f_mean, f_var), "c_lower": pg_tilt_c(f_mean - lower, f_var)}

    def _expected_omegas(self, y: Tensor, q_aux: AuxDict) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        c_u, c_l = q_aux["c_upper"], q_aux["c_lower"]
        upper, lower, n_u, n_l = self._bounds(y, c_u.dtype)
        return pg_mean(n_u, c_u), pg_mean(n_l, c_l), upper, lower, n_u, n_l

    def expected_potential_and_precision(
        self, y: Tensor, q_aux: AuxDict, f_mean: Tensor, f_var: Tensor
    ) -> tuple[Tensor, Tensor]:
        w_u, w_l, upper, lower, n_u, n_l = self._expected_omegas(y, q_aux)
        return w_u * upper - n_u / 2 + w_l * lower + n_l / 2, w_u + w_l

    def expected_log_tilt_constant(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        w_u, w_l, upper, lower, n_u, n_l = self._expected_omegas(y, q_aux)
        return (
            n_u * (upper / 2 - LOG2)
            - w_u * upper**2 / 2
            + n_l * (-lower / 2 - LOG2)
            - w_l * lower**2 / 2
            + self._log_gap(upper, lower, n_u, n_l)
        )

    def aux_kl(self, y: Tensor, q_aux: AuxDict) -> Tensor:
        _, _, n_u, n_l = self._bounds(y, q_aux["c_upper"].dtype)
        return pg_kl(n_u, q_aux["c_upper"]) + pg_kl(n_l, q_aux["c_lower"])

    def collapsed_bound(self, y: Tensor, f_mean: Tensor, f_var: Tensor) -> Tensor:
        upper, lower, n_u, n_l = self._bounds(y, f_mean.dtype)
        c_u, c_l = pg_tilt_c(upper - f_mean, f_var), pg_tilt_c(f_mean - lower, f_var)
        return (
            n_u * log_sigma_tilde_plus(upper - f_mean, c_u)
            + n_l * log_sigma_tilde_plus(f_mean - lower, c_l)
            + self._log_gap(upper, lower, n_u, n_l)
        )
