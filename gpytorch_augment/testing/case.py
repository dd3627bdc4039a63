r"""The :class:`LikelihoodCase` record of the protocol suite and the helpers for writing one.

A case says how to build a likelihood, how to draw targets from it and how to integrate its auxiliary variables
out analytically; the identity checks of :mod:`gpytorch_augment.testing.identities` need nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from gpytorch_augment._numerics import gauss_hermite, log_cosh
from gpytorch_augment.distributions import PolyaGamma
from gpytorch_augment.distributions.auxiliary import AuxiliaryDistribution
from gpytorch_augment.likelihoods import AugmentedLikelihood

#: auxiliary variables (or their variational parameters), one tensor per name
AuxDict = dict[str, Tensor]


def _no_kwargs(shape: torch.Size, generator: torch.Generator) -> dict[str, Tensor]:
    return {}


def gauss_hermite_expected_log_lik(likelihood: AugmentedLikelihood, y: Tensor, m: Tensor, s: Tensor) -> Tensor:
    r""":math:`E_{\mathcal N(m, s)} \log p(y\mid f)` per datum by 100-node Gauss--Hermite (one latent).

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import gauss_hermite_expected_log_lik
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> lik = BERNOULLI_CASE.make()
        >>> y = lik.check_targets(torch.tensor([1.0, 0.0], dtype=torch.float64))
        >>> m, s = torch.tensor([0.5, -1.0], dtype=torch.float64), torch.ones(2, dtype=torch.float64)
        >>> bool((gauss_hermite_expected_log_lik(lik, y, m, s) < lik.log_prob_at(y, m)).all())  # Jensen
        True
    """
    if likelihood.num_latents != 1:
        raise NotImplementedError("1-D Gauss--Hermite is for one latent: give the case its own expected_log_lik")
    nodes, weights = gauss_hermite(m, s, 100)
    return (weights * likelihood.log_prob_at(y, nodes)).sum(0)


def log_pg_laplace(b: Tensor, t: Tensor) -> Tensor:
    r""":math:`\log E_{\mathrm{PG}(b,0)} e^{-t\omega} = -b\log\cosh\sqrt{t/2}` (:doc:`/maths/binary`),
    for ``t >= 0``.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import log_pg_laplace
        >>> b, t = torch.ones(3, dtype=torch.float64), torch.tensor([0.0, 1.0, 8.0], dtype=torch.float64)
        >>> log_pg_laplace(b, t)                              # -log cosh(sqrt(t / 2))
        tensor([-0.0000, -0.2316, -1.3250], dtype=torch.float64)
    """
    return -b * log_cosh((t.clamp_min(0) / 2).sqrt())


@dataclass(frozen=True)
class LikelihoodCase:
    r"""One likelihood registered in the protocol suite: what the identity checks need to know about it.

    Rules for the fields:

    * ``name``: a short identifier (it names the pytest parameter).
    * ``make()`` returns a **fresh** likelihood in float64, with hyper-parameters set to non-default values where
      it has any (e.g. :math:`\theta\ne1`, non-integer :math:`r`, :math:`\nu\ne1`, :math:`\sigma\ne1`).
    * ``sample_targets(f, generator, **kwargs)`` draws :math:`y \sim p(y\mid f)` at the latents ``f`` (shape
      ``(*batch, N)``, or ``(*batch, N, T)`` for ``T`` latents), using only ``generator`` for randomness.
    * ``marginalise(likelihood, y, f)`` returns :math:`\log\int \text{tilt}\cdot p(\Omega\mid y)\,d\Omega`
      per datum **without sampling** (identity (c)), from the likelihood's own ``log_tilt`` and ``aux_prior`` and an
      analytic integral over :math:`\Omega`: :func:`marginalise_single_pg` for one Pólya-Gamma variable
      (:func:`log_pg_laplace` is the Laplace transform), a truncated sum for counts, adaptive quadrature for
      continuous auxiliaries (then set ``marginalise_atol=1e-7``).
    * ``q_aux_distribution(likelihood, y, q_aux)`` returns the law of :math:`q^*(\Omega)` for the variational
      parameters ``q_aux`` as an :class:`~gpytorch_augment.distributions.auxiliary.AuxiliaryDistribution` whose
      ``sample()`` returns a dict shaped like the Gibbs draws (identity (d); use an exact sampler).
    * ``num_latents``: ``T``. Latents are ``(N, T)``, potentials and precisions ``(T, N)``; auxiliaries with one
      value per latent are declared ``Independent(..., 1)`` so that their log-density is one value per datum.
    * ``make_kwargs(shape, generator)`` (optional) returns the per-datum keyword data the public entry points take
      (binomial ``trials``...), tensors of the data shape. They are passed to ``sample_targets``, to
      ``check_targets`` and to every public entry point (``expected_log_prob``, ``CAVI.step``...); the pure protocol
      members receive the canonical targets ``likelihood.check_targets(y, **kwargs)`` only.
    * ``expected_log_lik(likelihood, y, m, s)`` (optional): :math:`E_{\mathcal N(m,s)}\log p(y\mid f)` per datum,
      the right-hand side of identity (f). The default, :func:`gauss_hermite_expected_log_lik`, is valid for one latent
      only; a multi-latent likelihood supplies a product rule or a closed form.
    * ``f_bound``, the tolerances and the Monte-Carlo sizes below: keep the defaults unless the likelihood needs
      otherwise, and say why in a comment.
    * ``skip``: identity letter (``"a"`` ... ``"h"``) -> the reason it does not apply. Use it sparingly: a
      skipped identity is an untested identity.
    * **Registration fields** (optional for a third-party case; this package's registry requires them of the first
      case of each class, its *primary* case, and its tests fail naming what is missing):
      ``example_targets(n, dtype)`` returns deterministic valid targets for ``n`` points and their keyword data,
      ``(y, kwargs)`` (the fuzz matrix uses them); ``constructor_kwargs`` are the arguments of a default instance,
      :meth:`default_likelihood` (e.g. ``{"num_classes": 3}``); ``constants`` names the positive constants whose
      constructor argument and setter must reject bad values, ``constant_priors`` the constructor's prior
      arguments that must reject bad priors, each with the further arguments it needs (the constants matrix).
      The likelihood tables of the documentation come from the classes themselves
      (:attr:`~gpytorch_augment.likelihoods.AugmentedLikelihood.augmentation`), not from the cases.
    * ``extras``: optional hooks. ``extras["mc_expectations"](likelihood, y, q_aux, aux_draws)`` returns
      ``{name: (closed_form, per_draw_values)}`` for further identity (d) comparisons (e.g. :math:`E\log\omega`);
      ``extras["gpytorch_covariance_scale"]`` and ``extras["gpytorch_skip"]`` configure GPyTorch's likelihood
      tests (:mod:`gpytorch_augment.testing.gpytorch_base`).

    Example::

        >>> import dataclasses
        >>> from gpytorch_augment.testing import LikelihoodCase
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> isinstance(BERNOULLI_CASE, LikelihoodCase), BERNOULLI_CASE.num_latents, BERNOULLI_CASE.f_bound
        (True, 1, 4.0)
        >>> quick = dataclasses.replace(BERNOULLI_CASE, name="quick", mc_samples=2_000)   # a variant
        >>> quick, quick.mc_samples
        (quick, 2000)
    """

    name: str
    make: Callable[[], AugmentedLikelihood]
    sample_targets: Callable[..., Tensor]
    marginalise: Callable[[AugmentedLikelihood, Tensor, Tensor], Tensor]
    q_aux_distribution: Callable[[AugmentedLikelihood, Tensor, AuxDict], AuxiliaryDistribution]
    num_latents: int = 1
    make_kwargs: Callable[[torch.Size, torch.Generator], dict[str, Tensor]] = _no_kwargs
    expected_log_lik: Callable[[AugmentedLikelihood, Tensor, Tensor, Tensor], Tensor] = gauss_hermite_expected_log_lik
    #: the test latents satisfy :math:`|f| \le` ``f_bound`` (4 in the data recipe)
    f_bound: float = 4.0
    #: identity (a): :math:`|\log C^{(k)} - \log p| \le` ``consistency_rtol`` :math:`\cdot (1 + |\log p|)`
    consistency_rtol: float = 1e-9
    #: identity (c): 1e-9 for exact sums/closed forms, 1e-7 for adaptive quadrature
    marginalise_atol: float = 1e-9
    #: identity (d): number of Monte-Carlo draws of (f, Ω)
    mc_samples: int = 100_000
    #: identity (d): of those, how many enter the Monte-Carlo KL (log q - log p needs the auxiliary log-densities;
    #: the Pólya-Gamma series makes them the dominant cost). The 5-SE tolerance is unchanged.
    mc_kl_samples: int = 20_000
    #: identity (h): number of full-batch CAVI sweeps before the convergence check (50; more where a closed-form
    #: hyper-parameter update trades off against the level of f and coordinate ascent is slow, e.g. Poisson ξ)
    cavi_sweeps: int = 50
    #: identity letter -> reason it does not apply
    skip: Mapping[str, str] = field(default_factory=dict)
    #: free-form extras a later likelihood may need in its hooks
    extras: Mapping[str, Any] = field(default_factory=dict)
    #: registration: ``(n, dtype) -> (y, kwargs)``, deterministic valid targets for ``n`` points
    example_targets: Callable[[int, torch.dtype], tuple[Tensor, dict[str, Tensor]]] | None = None
    #: registration: the constructor arguments of a default instance (:meth:`default_likelihood`)
    constructor_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: registration: positive constants whose constructor argument and setter reject bad values
    constants: tuple[str, ...] = ()
    #: registration: prior arguments of the constructor that reject bad priors -> the further constructor arguments
    #: a prior needs (e.g. ``{"class_scale_prior": {"learn_class_scales": True}}``)
    constant_priors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __repr__(self) -> str:  # short ids in pytest output
        return self.name

    def default_likelihood(self) -> AugmentedLikelihood:
        """A default instance of the case's class: ``type(make())(**constructor_kwargs)``, in torch's default
        dtype."""
        return type(self.make())(**self.constructor_kwargs)


def cyclic_targets(
    period: int, trials: float | None = None
) -> Callable[[int, torch.dtype], tuple[Tensor, dict[str, Tensor]]]:
    r"""``example_targets`` of labels or counts: :math:`y_i = i \bmod` ``period``, with ``trials`` (binomial) as
    keyword data where given.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import cyclic_targets
        >>> y, kwargs = cyclic_targets(3, trials=3.0)(5, torch.float64)
        >>> y, kwargs["trials"]
        (tensor([0., 1., 2., 0., 1.], dtype=torch.float64), tensor([3., 3., 3., 3., 3.], dtype=torch.float64))
    """

    def example(n: int, dtype: torch.dtype) -> tuple[Tensor, dict[str, Tensor]]:
        y = (torch.arange(n) % period).to(dtype)
        return y, ({} if trials is None else {"trials": torch.full((n,), float(trials), dtype=dtype)})

    return example


def real_targets(n: int, dtype: torch.dtype) -> tuple[Tensor, dict[str, Tensor]]:
    """``example_targets`` of regression: ``n`` values evenly spaced on [-1, 1], no keyword data.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import real_targets
        >>> real_targets(3, torch.float64)
        (tensor([-1.,  0.,  1.], dtype=torch.float64), {})
    """
    return torch.linspace(-1, 1, n, dtype=dtype), {}


def marginalise_single_pg(likelihood: AugmentedLikelihood, y: Tensor, f: Tensor) -> Tensor:
    r""":math:`\log\int C e^{hf-\frac12\lambda f^2}\,\mathrm{PG}(\omega\mid b, 0)\,d\omega` for a tilt with
    :math:`\lambda` linear in the Pólya-Gamma variable ``omega`` (Bernoulli, binomial), which is the only auxiliary.

    :math:`\log C + hf` is the log-tilt at :math:`\omega=0`; :math:`t=\frac12\lambda(1)f^2` is the drop of the
    log-tilt from :math:`\omega=0` to :math:`\omega=1`; the prior's :math:`b` comes from ``aux_prior``. With one
    ``omega`` per latent (prior ``Independent(PolyaGamma(b, 0), 1)`` with ``b`` of shape ``(N, T)``) the latents
    are integrated one at a time.

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import marginalise_single_pg, protocol_data
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> d = protocol_data(BERNOULLI_CASE, n=5)
        >>> torch.allclose(marginalise_single_pg(d.likelihood, d.y, d.f), d.likelihood.log_prob_at(d.y, d.f))
        True
    """
    prior = likelihood.aux_prior(y).factors["omega"]
    if isinstance(prior, torch.distributions.Independent):  # one omega per latent, summed into one value per datum
        prior = prior.base_dist
    assert isinstance(prior, PolyaGamma) and bool((prior.c == 0).all()), "expected a PG(b, 0) prior"
    if likelihood.num_latents == 1:
        at_zero = likelihood.log_tilt(y, {"omega": torch.zeros_like(f)}, f)
        t = at_zero - likelihood.log_tilt(y, {"omega": torch.ones_like(f)}, f)
        return at_zero + log_pg_laplace(prior.b, t)
    zero = torch.zeros_like(f)  # (..., N, T): one omega per latent
    at_zero = likelihood.log_tilt(y, {"omega": zero}, f)
    out = at_zero
    for j in range(likelihood.num_latents):
        unit = zero.clone()
        unit[..., j] = 1.0
        t = at_zero - likelihood.log_tilt(y, {"omega": unit}, f)
        out = out + log_pg_laplace(prior.b[..., j], t)
    return out
