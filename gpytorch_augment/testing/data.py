r"""The data recipes of the protocol suite (:doc:`/maths/identities`).

Both draw their random numbers from their own seeded ``torch.Generator`` in the default dtype and then cast, so
the protocol suite sets the default dtype to float64 while it runs (as the identity tolerances assume).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from torch import Tensor

from gpytorch_augment.likelihoods import AugmentedLikelihood
from gpytorch_augment.testing.case import LikelihoodCase


def latent_shape(case: LikelihoodCase, n: int, batch: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The shape of the latents of ``n`` data: ``(*batch, n)`` for one latent, ``(*batch, n, T)`` for ``T``.

    Example::

        >>> from gpytorch_augment.testing import latent_shape
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> latent_shape(BERNOULLI_CASE, 5), latent_shape(BERNOULLI_CASE, 5, batch=(2,))
        ((5,), (2, 5))
    """
    return (*batch, n) if case.num_latents == 1 else (*batch, n, case.num_latents)


def to_latent_major(t: Tensor, case_or_likelihood: LikelihoodCase | AugmentedLikelihood) -> Tensor:
    """``(..., N, T)`` -> ``(..., T, N)`` for ``T > 1`` latents (the layout of potentials); unchanged for one.

    Example::

        >>> import torch
        >>> from types import SimpleNamespace
        >>> from gpytorch_augment.testing import to_latent_major
        >>> to_latent_major(torch.zeros(5, 3), SimpleNamespace(num_latents=3)).shape   # (N, T) -> (T, N)
        torch.Size([3, 5])
        >>> to_latent_major(torch.zeros(5), SimpleNamespace(num_latents=1)).shape      # one latent: unchanged
        torch.Size([5])
    """
    return t.mT if case_or_likelihood.num_latents > 1 else t


def protocol_data(
    case: LikelihoodCase,
    n: int = 15,
    seed: int = 0,
    batch: tuple[int, ...] = (),
    dtype: torch.dtype = torch.float64,
    likelihood: AugmentedLikelihood | None = None,
) -> SimpleNamespace:
    r"""The data recipe of the identities (:doc:`/maths/identities`): latents :math:`|f|\le` ``case.f_bound``,
    :math:`y` drawn from the model at
    :math:`f`, marginals :math:`m_i\sim\mathcal N(0,1)`, :math:`s_i\sim U(0.1,1)`.

    :param likelihood: the likelihood to check (default ``case.make()``; e.g. a deliberately broken variant).
    :return: a namespace with ``likelihood``, ``y`` (canonical targets), ``y_raw`` and ``kwargs`` (what the public
        entry points take), ``f``, ``m``, ``s`` and the ``generator`` (to be used for any further draws).

    Example::

        >>> from gpytorch_augment.testing import protocol_data
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> d = protocol_data(BERNOULLI_CASE, n=4, batch=(2,))
        >>> d.f.shape, d.f.dtype, bool(d.f.abs().max() <= BERNOULLI_CASE.f_bound)
        (torch.Size([2, 4]), torch.float64, True)
        >>> bool(((d.s >= 0.1) & (d.s <= 1)).all())
        True
    """
    g = torch.Generator().manual_seed(seed)
    shape = latent_shape(case, n, batch)
    f = ((torch.rand(shape, generator=g) * 2 - 1) * case.f_bound).to(dtype)
    m = torch.randn(shape, generator=g).to(dtype)
    s = (0.1 + 0.9 * torch.rand(shape, generator=g)).to(dtype)
    kwargs = case.make_kwargs(torch.Size((*batch, n)), g)
    y_raw = case.sample_targets(f, g, **kwargs)
    lik = case.make() if likelihood is None else likelihood
    lik = lik.to(dtype)
    y = lik.check_targets(y_raw, **kwargs)
    return SimpleNamespace(likelihood=lik, y=y, y_raw=y_raw, kwargs=kwargs, f=f, m=m, s=s, generator=g)


def gp_data(case: LikelihoodCase, n: int = 40, seed: int = 1, dtype: torch.dtype = torch.float64) -> SimpleNamespace:
    """A 1-D toy problem for the GP-level identities: smooth latents with nonzero mean, targets from the model.

    :return: a namespace with inputs ``x`` ``(n, 1)``, raw targets ``y``, keyword data ``kwargs``, a fresh
        ``likelihood`` and the ``generator``.

    Example::

        >>> from gpytorch_augment.testing import gp_data
        >>> from gpytorch_augment.testing.examples import BERNOULLI_CASE
        >>> d = gp_data(BERNOULLI_CASE, n=6)
        >>> d.x.shape, d.y.shape, d.x.dtype
        (torch.Size([6, 1]), torch.Size([6]), torch.float64)
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    phase = torch.arange(case.num_latents, dtype=x.dtype) * 1.3
    f = 0.5 + 0.45 * case.f_bound * torch.sin(2 * x + phase)  # (n, T)
    if case.num_latents == 1:
        f = f.squeeze(-1)
    kwargs = case.make_kwargs(torch.Size([n]), g)
    y = case.sample_targets(f, g, **kwargs)
    lik = case.make().to(dtype)
    kwargs = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in kwargs.items()}
    return SimpleNamespace(x=x.to(dtype), y=y.to(dtype), kwargs=kwargs, likelihood=lik, generator=g)


def function_dist(mean: Tensor, covariance: Tensor, num_latents: int = 1) -> MultivariateNormal:
    """:math:`q(f)` in GPyTorch's layout from latent-major moments.

    :param mean: ``(*batch, N)`` for one latent, ``(*batch, T, N)`` for ``T``.
    :param covariance: ``(*batch, N, N)``, or ``(*batch, T, N, N)`` (independent latents).
    :return: a ``MultivariateNormal`` (one latent) or a ``MultitaskMultivariateNormal`` with ``T`` tasks in the last
        dimension (what a multi-latent likelihood receives from ``IndependentMultitaskVariationalStrategy``).

    Example::

        >>> import torch
        >>> from gpytorch_augment.testing import function_dist
        >>> q = function_dist(torch.zeros(3, 4), torch.eye(4).expand(3, 4, 4), num_latents=3)   # T = 3, N = 4
        >>> type(q).__name__, q.mean.shape
        ('MultitaskMultivariateNormal', torch.Size([4, 3]))
    """
    dist = MultivariateNormal(mean, covariance)
    if num_latents == 1:
        return dist
    return MultitaskMultivariateNormal.from_batch_mvn(dist, task_dim=-1)
