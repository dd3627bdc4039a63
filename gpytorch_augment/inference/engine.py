r"""The interface through which the one-call fit's protocols drive the CAVI engine.

:class:`CAVIEngine` declares what the nested protocol (:mod:`~gpytorch_augment.inference.nested`), the stochastic one
(:mod:`~gpytorch_augment.inference.hyperparameters`) and a fit's settings use of a :class:`~gpytorch_augment.CAVI`:

* what it fits: :attr:`~CAVIEngine.model`, :attr:`~CAVIEngine.likelihood`, :attr:`~CAVIEngine.strategy`,
  :attr:`~CAVIEngine.num_data`, :attr:`~CAVIEngine.process_group` / :attr:`~CAVIEngine.distributed`, its checks of
  a hyper-parameter optimizer, where a shuffled fit is in its epoch, and an engine for a subset of the data
  (:meth:`~CAVIEngine.on_subset`);
* the data: checked once, at the entry point, into an :class:`~gpytorch_augment.core.ObservedData`
  (:meth:`~CAVIEngine.check_data`), which every member below takes;
* one update: the prior terms at the data (:meth:`~CAVIEngine.prior_terms`), one closed-form local and global step
  on them (:meth:`~CAVIEngine.update`), and the marginals of :math:`q(f)` they imply
  (:meth:`~CAVIEngine.marginal_distribution`);
* :math:`q(u)` itself: frozen while a hyper-parameter loss is back-propagated (:meth:`~CAVIEngine.frozen_q`), copied
  and put back (:meth:`~CAVIEngine.q_state`, :meth:`~CAVIEngine.load_q_state`);
* the inner loop: CAVI steps over a fit's batches until its stopping rule or a cap (:meth:`~CAVIEngine.run`).

**Rules.** A protocol uses the engine through these members only (no private member, no call back into
``CAVI.fit``); ``CAVI.fit`` dispatches to the protocols or runs :meth:`~CAVIEngine.run` itself. A protocol checks
its data once, by :meth:`~CAVIEngine.check_data`, and passes the value on: no member checks the targets again. Tensors
in the
likelihood's layout are ``(N,)`` for one latent and ``(N, T)`` for ``T`` latents; the whitened :math:`q(v)`
(:class:`~gpytorch_augment.core.WhitenedGaussian`) and the prior terms are latent-major.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from gpytorch.models import ApproximateGP
from linear_operator.operators import DiagLinearOperator
from torch import Tensor

from ..core import ObservedData, PriorTerms, WhitenedGaussian
from ..likelihoods.augmented_likelihood import AugmentedLikelihood
from ..variational import CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy
from ._batches import ShuffleCursor
from ._fit_config import FitConfig
from .convergence import CAVITrace

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["CAVIEngine", "diagonal_gaussian"]


@runtime_checkable
class CAVIEngine(Protocol):
    r"""What a protocol may use of the CAVI engine (:class:`~gpytorch_augment.CAVI` implements it).

    Example::

        >>> import torch, gpytorch_augment as ga, gpytorch_augment.testing as gt
        >>> x = torch.linspace(0, 6, 40, dtype=torch.float64).unsqueeze(-1)
        >>> y = (x.squeeze(-1).cos() > 0).double()
        >>> engine: CAVIEngine = ga.CAVI(gt.SVGP(x[::5].clone()).double(), ga.BernoulliLogitLikelihood(), num_data=40)
        >>> data = engine.check_data(x, y)         # checked once; every member below takes the value
        >>> terms = engine.prior_terms(data, cache=True)
        >>> for _ in range(3):                    # three full-batch CAVI updates, the likelihood's constants held
        ...     elbo, q = engine.update(data, terms, update_constants=False)
        >>> engine.marginal_distribution(terms, q, x.dtype).mean.shape
        torch.Size([40])
    """

    @property
    def model(self) -> ApproximateGP:
        """The GP model; its strategy holds :math:`q(u)`."""

    @property
    def likelihood(self) -> AugmentedLikelihood:
        """The augmented likelihood."""

    @property
    def strategy(self) -> CAVIVariationalStrategy | UnwhitenedCAVIVariationalStrategy:
        """The model's CAVI strategy (the base strategy inside a multitask wrapper)."""

    @property
    def num_data(self) -> int:
        """The number of training points (observations, for linear observations) :math:`N` of the whole data."""

    @property
    def process_group(self) -> ProcessGroup | None:
        """The ``torch.distributed`` group the data are sharded over (``None``: the default group)."""

    @property
    def distributed(self) -> bool:
        """Whether steps reduce their statistics over several processes."""

    @property
    def shuffle_cursor(self) -> ShuffleCursor:
        """Where a shuffled mini-batch fit is in its epoch (the next fit on tensors continues there)."""

    def on_subset(self, num_data: int) -> CAVIEngine:
        """An engine for a subset of ``num_data`` of the training points, sharing the model, the likelihood and
        :math:`q(u)` (with its own step count and caches)."""

    def check_data(
        self, x: Tensor, y: Tensor, kwargs: Mapping[str, Any] | None = None, *, where: str = "CAVI.check_data"
    ) -> ObservedData:
        """The data ``(x, y, **kwargs)`` checked once (:func:`~gpytorch_augment.core.check_data`, plus the model's
        batch shape, input dimension and dtype): ``ValueError``/``TypeError`` naming ``where`` and the offending
        argument, else the checked value."""

    def check_hyper_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Raise ``ValueError`` if ``optimizer`` holds :math:`q(u)`'s parameters (CAVI updates those)."""

    def prior_terms(self, data: ObservedData, cache: bool) -> PriorTerms:
        """The prior terms the update works on at the inputs of ``data`` (of its linear observations, for a
        likelihood that has them); ``cache``: keep them while the hyper-parameters stay put."""

    def update(
        self, data: ObservedData, terms: PriorTerms, update_constants: bool = True, with_elbo: bool = True
    ) -> tuple[Tensor, WhitenedGaussian]:
        r"""One closed-form CAVI update on the checked ``data`` at ``terms`` (no checks): the local step, the
        likelihood's closed-form constant updates (unless ``update_constants`` is off) and the damped global step,
        written into the model. Returns the augmented ELBO per datum of the entry state, in the data's dtype (NaN
        without ``with_elbo``), and the new whitened :math:`q(v)`."""

    def marginal_distribution(self, terms: PriorTerms, q: WhitenedGaussian, dtype: torch.dtype) -> MultivariateNormal:
        r"""The diagonal :math:`q(f)` of the whitened ``q`` at the inputs of ``terms``, in GPyTorch's layout for the
        likelihood and in ``dtype`` (with a graph to the hyper-parameters where ``terms`` has one)."""

    def frozen_q(self) -> AbstractContextManager[None]:
        """A context in which :math:`q(u)`'s parameters take no gradient (a hyper-parameter loss is
        back-propagated to the hyper-parameters only)."""

    def q_state(self) -> list[Tensor]:
        """A detached copy of :math:`q(u)`'s parameters."""

    def load_q_state(self, state: list[Tensor]) -> None:
        """Put a :meth:`q_state` back into the model (in place, without a graph)."""

    def run(
        self, config: FitConfig, callback: Callable[[int, float], object] | None = None, progress: bool = False
    ) -> CAVITrace:
        """CAVI steps over the batches of ``config`` (each followed by its hyper-parameter steps) until its stopping
        rule or a cap, the model and the likelihood in training mode; ``trace.converged`` says which."""


def diagonal_gaussian(likelihood: AugmentedLikelihood, mean: Tensor, var: Tensor) -> MultivariateNormal:
    """The diagonal :math:`q(f)` with latent-major marginals ``mean``, ``var`` (``(*batch, T, N)`` for ``T > 1``
    latents), in GPyTorch's layout for the likelihood."""
    if likelihood.num_latents > 1:
        return MultitaskMultivariateNormal(mean.mT, DiagLinearOperator(var.mT.reshape(*var.shape[:-2], -1)))
    return MultivariateNormal(mean, DiagLinearOperator(var))
