r"""The Bayesian support vector machine: the hinge-loss pseudo-likelihood, an instance of the generic augmentation
:class:`~gpytorch_augment.likelihoods.LaplaceTransformLikelihood` with the Lévy mixing law
(:doc:`/maths/generic`)."""

from __future__ import annotations

import math
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.distributions import Bernoulli

from .bernoulli import BernoulliLogitLikelihood
from .laplace_transform import LaplaceTransformLikelihood
from .mixing_laws import InverseGammaMixing

__all__ = ["BayesianSVMLikelihood"]

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def svm_logits(f: Tensor) -> Tensor:
    r""":math:`\log L(1\mid f) - \log L(-1\mid f) = 2\,(\max(1 + f, 0) - \max(1 - f, 0))`: :math:`4f` on
    :math:`|f|\le1`, :math:`2f \pm 2` outside."""
    return 2 * (torch.relu(1 + f) - torch.relu(1 - f))


class BayesianSVMLikelihood(LaplaceTransformLikelihood):
    r"""Binary classification with the hinge loss (Polson and Scott 2011; Wenzel et al. 2017), :doc:`/maths/generic`:
    the **pseudo-likelihood**

    .. math::
        L(y\mid f) = e^{-2\max(1 - s_y f,\,0)}, \qquad s_y = 2y - 1,

    whose maximiser under a GP prior is the (kernel) support vector machine. With :math:`e^{-2\max(x, 0)} =
    e^{-x}e^{-|x|}` and :math:`e^{-|x|} = \varphi(x^2/2)` for the Lévy law :math:`\omega\sim\mathrm{InvGamma}
    (\tfrac12, \tfrac12)`, :math:`\varphi(r) = e^{-\sqrt{2r}}`, and :math:`s_y^2 = 1`:

    .. math::
        L(y, \omega\mid f) = e^{-1 + s_y f - \frac12(1 - s_y f)^2\omega}\,\mathrm{InvGamma}(\omega\mid\tfrac12,
        \tfrac12), \qquad h = s_y(1 + \omega), \quad \lambda = \omega,

    i.e. :math:`\log C = -1`, :math:`g = s_y`, :math:`\alpha = \gamma = \tfrac12`, :math:`\beta = s_y`.

    * Gibbs: :math:`\omega\mid y, f\sim\mathrm{IG}(1/|1 - s_y f|, 1)`; Polson and Scott's latent is
      :math:`1/\omega\sim\mathrm{GIG}(\tfrac12, 1, (1 - s_y f)^2)`.
    * CAVI: :math:`q(\omega_i) = \mathrm{IG}(1/c_i, 1)`, :math:`c_i = \sqrt{(1 - s_i m_i)^2 + s_{ii}}` (the
      marginal variance), :math:`\bar h_i = s_i(1 + 1/c_i)`, :math:`\bar\lambda_i = 1/c_i`, and
      :math:`\ell^*_i = -1 + s_i m_i - c_i`.

    **Predictive.** :math:`L` is not normalised over :math:`y` (:math:`L(1\mid f) + L(-1\mid f) < 1`), so the
    model has no law of :math:`y` of its own. As in AugmentedGaussianProcesses.jl (``BayesianSVM``, Wenzel et al.
    2017) the predictive uses the normalised pseudo-likelihood

    .. math::
        p(y = 1\mid f) = \frac{L(1\mid f)}{L(1\mid f) + L(-1\mid f)} = \sigma\big(2\max(1 + f, 0) -
        2\max(1 - f, 0)\big),

    a logistic link that is :math:`\sigma(4f)` on :math:`|f| \le 1`. So the members split in two:

    * **training** uses :math:`L`: :meth:`log_prob_at`, :meth:`expected_log_prob` (closed form,
      :math:`-2E\max(1 - s_y f, 0)`), the augmented ELBO, CAVI and the samplers;
    * **prediction** uses the normalised link: ``likelihood(f)`` (:meth:`forward`) and ``likelihood(q_f)``
      (:meth:`marginal`, :math:`p(y_* = 1) = E_{q(f_*)}\,\sigma(\cdot)` by Gauss--Hermite) are ``Bernoulli``,
      :meth:`log_marginal` is its log-mass (a test log-likelihood).

    Labels :math:`y\in\{0, 1\}` (or :math:`\{-1, 1\}`, :math:`s_y = y`), as for
    :class:`~gpytorch_augment.BernoulliLogitLikelihood`; AugmentedGaussianProcesses.jl writes the same local
    updates (:math:`c^2 = (1 - y\mu)^2 + \Sigma`, :math:`\theta = 1/c`, gradients :math:`y(1 + \theta)` and
    :math:`\theta/2`) for labels :math:`\pm1`.

    Example::

        >>> import torch
        >>> from gpytorch_augment import CAVI, BayesianSVMLikelihood
        >>> from gpytorch_augment.testing import make_cavi_model
        >>> x = torch.linspace(-2, 2, 20, dtype=torch.float64).unsqueeze(-1)
        >>> y = (x.squeeze(-1) > 0).double()
        >>> likelihood = BayesianSVMLikelihood().double()
        >>> model = make_cavi_model(1, x[::2].clone()).double()
        >>> trace = CAVI(model, likelihood, num_data=20).fit(x, y, max_iter=30)
        >>> probs = likelihood(model(torch.tensor([[-1.5], [1.5]], dtype=torch.float64))).probs
        >>> bool(probs[0] < 0.5 < probs[1])
        True
        >>> likelihood.log_prob_at(torch.tensor([1.0, 0.0]), torch.tensor([2.0, 0.5]))   # -2 max(1 - s f, 0)
        tensor([-0., -3.])
    """

    augmentation = "hinge-loss pseudo-likelihood, inverse-Gaussian (generic augmentation)"
    maths_page = "generic"

    def __init__(self) -> None:
        super().__init__(InverseGammaMixing(0.5, rate=0.5))

    #: labels in {0, 1} or in {-1, 1}, checked as for the Bernoulli-logit likelihood
    check_targets = BernoulliLogitLikelihood.check_targets
    _sign = staticmethod(BernoulliLogitLikelihood._sign)

    def coefficients(self, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        r""":math:`(-1, s_y, \tfrac12, s_y, \tfrac12)`."""
        s = self._sign(y)
        half = torch.full((), 0.5, dtype=s.dtype, device=s.device)
        return -torch.ones((), dtype=s.dtype, device=s.device), s, half, s, half

    def log_prob_at(self, y: Tensor, f: Tensor, **kwargs: Any) -> Tensor:
        r""":math:`\log L(y\mid f) = -2\max(1 - s_y f, 0)` (the pseudo-likelihood)."""
        return -2 * torch.relu(1 - self._sign(y).to(f.dtype) * f)

    def expected_log_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r""":math:`E_{q(f_i)}\log L(y_i\mid f_i) = -2\,(d\,\Phi(d/\sigma) + \sigma\,\phi(d/\sigma))`,
        :math:`d = 1 - s_i m_i`, :math:`\sigma^2 = s_{ii}` (the pseudo-likelihood, per datum)."""
        mean, var = function_dist.mean, function_dist.variance
        d = 1 - self._sign(y).to(mean.dtype) * mean
        sigma = var.clamp_min(torch.finfo(mean.dtype).tiny).sqrt()
        t = d / sigma
        return -2 * (d * torch.special.ndtr(t) + sigma * _INV_SQRT_2PI * torch.exp(-0.5 * t * t))

    # ------------------------------------------------------------------ prediction: the normalised link
    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Bernoulli:
        r""":math:`p(y = 1\mid f) = L(1\mid f)/(L(1\mid f) + L(-1\mid f))` over labels {0, 1}."""
        return Bernoulli(logits=svm_logits(function_samples))

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> Bernoulli:
        r""":math:`p(y_* = 1) = E_{q(f_*)}\,p(y = 1\mid f_*)` by Gauss--Hermite quadrature."""
        nodes, weights = self._quadrature(function_dist)
        return Bernoulli(probs=(weights * torch.sigmoid(svm_logits(nodes))).sum(0).clamp(0.0, 1.0))

    def log_marginal_lik(self, y: Tensor, function_dist: MultivariateNormal, **kwargs: Any) -> Tensor:
        r""":math:`\log p(y_*)` under :meth:`marginal` (the normalised predictive), per datum."""
        probs = self.marginal(function_dist).probs
        positive = y > 0
        return torch.where(positive, probs, 1 - probs).clamp_min(torch.finfo(probs.dtype).tiny).log()
