r"""The collapsed augmented bound: the augmented ELBO at the optimal :math:`q(u)` for a fixed :math:`q(\Omega)`."""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.mlls import MarginalLogLikelihood
from torch import Tensor

from ..core import PriorTerms, SufficientStatistics, WhitenedGaussian, check_data
from ..core.linalg import tri_solve
from ..likelihoods.augmented_likelihood import AugmentedLikelihood, AuxDict, validated_latent_blocks
from ..variational.cavi_variational_strategy import cavi_strategy_of

__all__ = ["CollapsedAugmentedELBO"]

#: above this many elements of the M x chunk cross-covariance, the bound is computed in chunks of the data
CHUNK_ELEMENTS = 2**22


class CollapsedAugmentedELBO(MarginalLogLikelihood):
    r"""The augmented ELBO at the optimal :math:`q(u)` for a fixed :math:`q(\Omega)`, per datum: a Titsias-style
    collapsed bound on :math:`\log p(y)` that is a smooth function of the hyper-parameters :math:`\theta` (kernel,
    mean, likelihood constants, inducing inputs) and can be maximised by L-BFGS, e.g. by BoTorch's
    ``fit_gpytorch_mll``.

    With :math:`q(\Omega)` fixed, every datum contributes :math:`E\log C_i - \mathrm{KL}_i + \bar h_i f_i -
    \tfrac12\bar\lambda_i f_i^2` in expectation, a quadratic in :math:`f`. With the whitened prior
    (:math:`K_{ZZ} = LL^\top`, :math:`A = L^{-1}K_{ZX}` with columns :math:`a_i`, prior means :math:`\mu_i`,
    :math:`b = \sum_i a_i(\bar h_i - \bar\lambda_i\mu_i)`, :math:`B = I + \sum_i a_i\bar\lambda_i a_i^\top`) the
    maximum over every Gaussian :math:`q(v)` is attained at :math:`q^*(v) = \mathcal N(B^{-1}b, B^{-1})` and is

    .. math::
        \mathcal L^*(\theta) = \sum_i \big(E\log C_i - \mathrm{KL}(q(\Omega_i)\Vert p(\Omega_i\mid y_i))\big)
        + \sum_i\big(\bar h_i\mu_i - \tfrac12\bar\lambda_i\mu_i^2\big)
        - \tfrac12\sum_i\bar\lambda_i\big(k_{ii} - \lVert a_i\rVert^2\big)
        + \tfrac12 b^\top B^{-1} b - \tfrac12\log\lvert B\rvert

    (summed over the latents for a multi-latent likelihood). It equals the augmented ELBO of :math:`(q^*(u),
    q(\Omega))`, so it is a lower bound on :math:`\log p(y)` for every :math:`q(\Omega)`; a Gaussian pseudo-likelihood
    (:math:`\bar\lambda_i = \sigma^{-2}`, :math:`\bar h_i = y_i/\sigma^2`) gives the SGPR bound of Titsias (2009).
    By the envelope theorem its gradient is that of the augmented ELBO at the fixed :math:`q^*(v)`, which is how it
    is computed in chunks: one pass without a graph sums the statistics :math:`(b, B)` over chunks of the data, a
    second back-propagates each chunk's terms at the fixed :math:`q^*(v)`. Memory is :math:`O(\text{chunk}\cdot M +
    M^2)` for value and gradient; with one chunk the formula above is differentiated directly.

    **Rules.** :math:`q(\Omega)` (``q_aux``) is held fixed (detached) during an optimisation; :meth:`update_aux` sets
    it to its optimum for the current :math:`q^*(u)` and writes :math:`q^*(u)` into the model
    (:meth:`write_optimal_q` writes it alone). Alternating
    :meth:`update_aux` with steps that increase :math:`\mathcal L^*` (e.g. a whole ``fit_gpytorch_mll``) never
    decreases the bound. The first evaluation calls :meth:`update_aux` from the model's current :math:`q(u)`. The
    training data are held by the MLL (``train_inputs``/``train_targets``, or :meth:`set_train_data`), because the
    bound needs all of them: calling it as ``mll(x, y)`` uses (and stores) ``x, y``; BoTorch calls
    :meth:`compute_custom_loss`. Likelihoods whose latents must be updated in blocks (``latent_blocks``, the
    heteroscedastic double bound) are not conjugate given :math:`q(\Omega)`: ``ValueError`` (use
    :class:`~gpytorch_augment.AugmentedELBO`).

    :param likelihood: an :class:`~gpytorch_augment.likelihoods.AugmentedLikelihood`.
    :param model: an ``ApproximateGP`` with a CAVI strategy (whitened or unwhitened, possibly batched inside
        ``IndependentMultitaskVariationalStrategy``).
    :param num_data: the number of training points :math:`N` (the bound is divided by it).
    :param train_inputs: ``(N, D)`` inputs (optional here; then :meth:`set_train_data` or ``mll(x, y)``).
    :param train_targets: ``(N,)`` targets.
    :param chunk_size: data points per chunk (default: :data:`CHUNK_ELEMENTS` :math:`/ M`).
    :param target_kwargs: per-datum data of the targets (e.g. ``trials=``).

    Example::

        >>> import torch, gpytorch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, CollapsedAugmentedELBO
        >>> from gpytorch_augment.testing import SVGP
        >>> x = torch.linspace(-3, 3, 50, dtype=torch.float64).unsqueeze(-1)
        >>> y = (x.squeeze(-1).sin() > 0).double()
        >>> model, likelihood = SVGP(x[::5].clone()).double(), BernoulliLogitLikelihood()
        >>> mll = CollapsedAugmentedELBO(likelihood, model, num_data=50, train_inputs=x, train_targets=y)
        >>> before = float(mll().detach())
        >>> for _ in range(3):                          # alternate q(Omega) with L-BFGS on theta
        ...     mll.update_aux()
        ...     opt = torch.optim.LBFGS(list(model.hyperparameters()), max_iter=20)
        ...     def closure():
        ...         opt.zero_grad(); loss = -mll(); loss.backward(); return loss
        ...     _ = opt.step(closure)
        >>> float(mll().detach()) > before
        True
    """

    likelihood: AugmentedLikelihood

    def __init__(
        self,
        likelihood: AugmentedLikelihood,
        model: Any,
        num_data: int,
        train_inputs: Tensor | None = None,
        train_targets: Tensor | None = None,
        chunk_size: int | None = None,
        **target_kwargs: Any,
    ) -> None:
        if not isinstance(likelihood, AugmentedLikelihood):
            raise TypeError(f"CollapsedAugmentedELBO needs an AugmentedLikelihood, got {type(likelihood).__name__}")
        if validated_latent_blocks(likelihood) is not None:
            raise ValueError(
                f"{type(likelihood).__name__} updates its latents in blocks (latent_blocks): it is not conjugate in "
                "f given q(Omega), so q(u) has no closed-form optimum to collapse. Use AugmentedELBO instead."
            )
        if int(num_data) <= 0:
            raise ValueError(f"num_data must be a positive integer, got {num_data}")
        if chunk_size is not None and int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
        super().__init__(likelihood, model)
        self.strategy = _strategy(model)
        self.num_data = int(num_data)
        self.chunk_size = None if chunk_size is None else int(chunk_size)
        self.x: Tensor | None = None
        self.y: Tensor | None = None
        #: :math:`q(\Omega)`, one dict per chunk of the data (``None`` until the first :meth:`update_aux`)
        self.q_aux: list[AuxDict] | None = None
        if train_inputs is not None or train_targets is not None:
            if train_inputs is None or train_targets is None:
                raise ValueError("pass both train_inputs and train_targets, or neither")
            self.set_train_data(train_inputs, train_targets, **target_kwargs)

    # ------------------------------------------------------------------------------------------------ data
    def set_train_data(self, x: Tensor, y: Tensor, **kwargs: Any) -> None:
        """Hold ``(x, y)`` as the training data (all :math:`N` points) and forget :math:`q(\\Omega)`."""
        data = check_data(self.likelihood, x, y, kwargs, where="CollapsedAugmentedELBO", allow_empty=True)
        x, y = data.x, data.y
        if y.shape[-1] != self.num_data or x.shape[-2] != self.num_data:
            raise ValueError(
                f"the collapsed bound needs all num_data={self.num_data} training points; got x of shape "
                f"{tuple(x.shape)} and {y.shape[-1]} targets"
            )
        self.x, self.y, self.q_aux = x, y, None

    def _chunks(self) -> list[slice]:
        size = self.chunk_size or max(1, CHUNK_ELEMENTS // max(self.strategy.inducing_points.shape[-2], 1))
        return [slice(s, s + size) for s in range(0, self.num_data, size)]

    def _data(self) -> tuple[Tensor, Tensor]:
        if self.x is None or self.y is None:
            raise ValueError("no training data: pass train_inputs/train_targets, call set_train_data or mll(x, y)")
        return self.x, self.y

    # ------------------------------------------------------------------------------------------------ pieces
    def _layout(self, t: Tensor) -> Tensor:
        return t.mT if self.likelihood.num_latents > 1 else t

    def _tilt(self, piece: slice, q_aux: AuxDict, terms: PriorTerms) -> tuple[Tensor, Tensor, Tensor]:
        r"""Per datum :math:`E\log C_i - \mathrm{KL}_i` and the latent-major :math:`(\bar h, \bar\lambda)` of the
        fixed :math:`q(\Omega)` under the current likelihood constants, in the linear-algebra dtype."""
        x, y = self._data()
        y = y[..., piece]
        dtype = terms.A.dtype
        # with q(Omega) fixed, (h, lam) do not depend on q(f) (no latent_blocks): any marginals serve
        zeros = self._layout(torch.zeros_like(terms.mu_X)).to(x.dtype)
        const = self.likelihood.expected_log_tilt_constant(y, q_aux) - self.likelihood.aux_kl(y, q_aux)
        h, lam = self.likelihood.expected_potential_and_precision(y, q_aux, zeros, zeros)
        return const.to(dtype), h.to(dtype), lam.to(dtype)

    def _terms(self, piece: slice) -> PriorTerms:
        return self.strategy.cavi_terms(self._data()[0][..., piece, :], cache=len(self._chunks()) == 1)

    @torch.no_grad()
    def _statistics(self) -> tuple[SufficientStatistics, Tensor, PriorTerms]:
        r"""One pass without a graph: the statistics :math:`(b, B - I)`, the part of :math:`\mathcal L^*` outside
        :math:`\tfrac12 b^\top B^{-1}b - \tfrac12\log|B|`, and the last chunk's prior terms (for :math:`L`)."""
        stats, rest, terms = None, 0.0, None
        for piece, q_aux in zip(self._chunks(), self._q_aux()):
            terms = self._terms(piece)
            const, h, lam = self._tilt(piece, q_aux, terms)
            part = SufficientStatistics.from_batch(terms.A, terms.mu_X, h, lam)
            stats = part if stats is None else stats + part
            rest = rest + _outside(const, h, lam, terms)
        return stats, rest, terms

    def _q_aux(self) -> list[AuxDict]:
        if self.q_aux is None:
            self.update_aux()
        return self.q_aux

    # ------------------------------------------------------------------------------------------------ public
    @torch.no_grad()
    def optimal_q(self) -> WhitenedGaussian:
        r"""The optimal whitened :math:`q^*(v) = \mathcal N(B^{-1}b, B^{-1})` for the current :math:`q(\Omega)`."""
        return WhitenedGaussian.optimal(self._statistics()[0])

    @torch.no_grad()
    def write_optimal_q(self) -> WhitenedGaussian:
        r"""Store :math:`q^*(u)` for the current :math:`q(\Omega)` and hyper-parameters in the model (one pass over
        the data without a graph); returns the whitened :math:`q^*(v)`."""
        stats, _, terms = self._statistics()
        q = WhitenedGaussian.optimal(stats)
        self.strategy.write_whitened(q, terms)
        return q

    @torch.no_grad()
    def update_aux(self, from_model: bool = False) -> None:
        r"""Set :math:`q(\Omega)` to its optimum for :math:`q^*(u)`, which is first written into the model
        (:meth:`write_optimal_q`; the augmented ELBO never decreases). The first time, or with ``from_model``, the
        model's current :math:`q(u)` is used as it is (e.g. right after :meth:`write_optimal_q`)."""
        x, y = self._data()
        if self.q_aux is not None and not from_model:
            self.write_optimal_q()
        q_aux = []
        for piece in self._chunks():
            terms = self._terms(piece)
            mean, var = self.strategy.whitened_q(terms).marginals(terms)
            mean, var = self._layout(mean).to(x.dtype), self._layout(var).to(x.dtype)
            q_piece = self.likelihood.aux_posterior(y[..., piece], mean, var)
            q_aux.append({k: v.detach() for k, v in q_piece.items()})
        self.q_aux = q_aux

    def forward(self, x: Tensor | None = None, y: Tensor | None = None, **kwargs: Any) -> Tensor:
        r""":math:`\mathcal L^*(\theta)/N` plus the hyper-parameter log-priors over :math:`N` (as GPyTorch's MLLs),
        differentiable with respect to every hyper-parameter of the model and the likelihood.

        :param x: the training inputs (default: those held); new ones replace them and reset :math:`q(\Omega)`.
        :param y: the training targets, with ``x``.
        """
        if isinstance(x, MultivariateNormal):
            raise TypeError(
                "CollapsedAugmentedELBO takes the training inputs, not a model output: call mll(x, y) or mll() "
                "with the data held by the MLL (it needs the inputs to collapse q(u))"
            )
        if x is not None:
            if y is None:
                raise ValueError("pass the targets y with the inputs x")
            if x is not self.x or y is not self._raw_y:
                self.set_train_data(x, y, **kwargs)
                self._raw_y = y
        self._q_aux()
        if len(self._chunks()) == 1:
            value = self._direct()
        else:
            params = self._hyperparameters()
            value = _Chunked.apply(self._value_and_grad, *params)
        return value / self.num_data + self._log_prior()

    _raw_y: Tensor | None = None

    def compute_custom_loss(self, **kwargs: Any) -> Tensor:
        """BoTorch's hook (``fit_gpytorch_mll`` calls it): the negative bound per datum on the held data."""
        return -self.forward()

    # ------------------------------------------------------------------------------------------------ value
    def _direct(self) -> Tensor:
        """One chunk: the closed form, differentiated by autograd."""
        piece = self._chunks()[0]
        terms = self._terms(piece)
        const, h, lam = self._tilt(piece, self._q_aux()[0], terms)
        stats = SufficientStatistics.from_batch(terms.A, terms.mu_X, h, lam)
        return (_outside(const, h, lam, terms) + _collapsed(stats)).to(self.x.dtype)

    def _value_and_grad(self, params: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
        """Chunks: the value from the summed statistics, the gradient by back-propagating every chunk's augmented
        ELBO terms at the fixed optimal :math:`q^*(v)` (envelope theorem)."""
        stats, rest, _ = self._statistics()
        value = rest + _collapsed(stats)
        q = WhitenedGaussian.optimal(stats)
        q = WhitenedGaussian(q.theta1.detach(), q.C.detach())
        grads = [torch.zeros_like(p) for p in params]
        for piece, q_aux in zip(self._chunks(), self._q_aux()):
            with torch.enable_grad():
                terms = self.strategy.cavi_terms(self.x[..., piece, :], cache=False)
                const, h, lam = self._tilt(piece, q_aux, terms)
                mean, var = q.marginals(terms)
                ell = const.sum() + (h * mean - 0.5 * lam * (mean.square() + var)).sum()
                if not ell.requires_grad:
                    continue
                parts = torch.autograd.grad(ell, params, allow_unused=True)
            for g, part in zip(grads, parts):
                if part is not None:
                    g.add_(part)
        return value.to(self.x.dtype), grads

    def _hyperparameters(self) -> list[Tensor]:
        variational = {id(p) for p in self.model.variational_parameters()}
        seen, params = set(), []
        for p in (*self.model.parameters(), *self.likelihood.parameters()):
            if p.requires_grad and id(p) not in variational and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        return params

    def _log_prior(self) -> Tensor | float:
        total: Tensor | float = 0.0
        for _, module, prior, closure, _ in self.named_priors():
            total = total + prior.log_prob(closure(module)).sum() / self.num_data
        return total


class _Chunked(torch.autograd.Function):
    """A value whose gradient with respect to ``params`` was computed chunk by chunk inside ``forward``."""

    @staticmethod
    def forward(ctx: Any, fn: Any, *params: Tensor) -> Tensor:
        value, grads = fn(list(params))
        ctx.save_for_backward(*grads)
        return value.detach()

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Any, ...]:
        return (None, *(grad_output.to(g.dtype) * g for g in ctx.saved_tensors))


def _outside(const: Tensor, h: Tensor, lam: Tensor, terms: PriorTerms) -> Tensor:
    r""":math:`\sum_i(E\log C_i - \mathrm{KL}_i) + \sum_i(\bar h_i\mu_i - \tfrac12\bar\lambda_i\mu_i^2) -
    \tfrac12\sum_i\bar\lambda_i(k_{ii} - \lVert a_i\rVert^2)`, summed over latents."""
    mu = terms.mu_X
    return const.sum() + (h * mu - 0.5 * lam * (mu.square() + terms.k_diag - terms.a_sq)).sum()


def _collapsed(stats: SufficientStatistics) -> Tensor:
    r""":math:`\tfrac12 b^\top B^{-1}b - \tfrac12\log|B|` with :math:`B = C^\top C`, summed over latents."""
    q = WhitenedGaussian.optimal(stats)
    w = tri_solve(q.C.mT, q.theta1.unsqueeze(-1), upper=True).squeeze(-1)  # C^{-T} b
    return 0.5 * w.square().sum() - q.C.diagonal(dim1=-1, dim2=-2).log().sum()


def _strategy(model: Any) -> Any:
    return cavi_strategy_of(model, needed_by="CollapsedAugmentedELBO")
