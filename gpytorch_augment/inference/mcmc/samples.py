r"""The draws of a run, whatever its kernel: :class:`PosteriorSamples` (storage, resume, diagnostics, ArviZ export,
prediction through the public interface of the :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget`)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from gpytorch.utils.warnings import NumericalWarning
from linear_operator.operators import DiagLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from ..._validation import check_finite, check_finite_state, check_state_keys, check_target_keywords
from ...core.linalg import add_to_diagonal, tri_solve, vecmat
from ...core.prior import linalg_advice, with_linalg_advice
from ...likelihoods.augmented_likelihood import AuxDict
from ..diagnostics import bulk_ess, rank_normalized_rhat, sd_ess, tail_ess
from .prediction import PosteriorPrediction
from .prior_parameters import PriorParameters, model_parameter_names
from .state import ChainState
from .summary import PosteriorSummary
from .target import PosteriorTarget

__all__ = ["PosteriorSamples"]


@dataclass
class PosteriorSamples:
    r"""Draws of a sampler run (:class:`~gpytorch_augment.GibbsSampler`, :class:`~gpytorch_augment.HMCSampler` or any
    :class:`~gpytorch_augment.inference.mcmc.MCMC` driver).

    :ivar f: latent draws ``(chains, draws, N)`` (``(chains, draws, T, N)`` for ``T`` latents).
    :ivar aux: auxiliary draws, one tensor per variable, ``(chains, draws, ...)``.
    :ivar u: inducing values ``(chains, draws, M)`` / ``(chains, draws, T, M)`` (sparse model), else ``None``.
    :ivar seed: the generator seed (``None`` for a run that continued a stored generator state).
    :ivar warmup, thin: settings of the run; ``num_sweeps`` counts every transition (warm-up included).
    :ivar f_update: the kernel's name: the Gibbs ``f``-update (``"auto"``, ``"whitened"``, ``"sparse"`` for the
        inducing-point model) or ``"hmc"``.
    :ivar elapsed: wall-clock seconds of the sampling loop.
    :ivar last: the :class:`ChainState` after the last transition (see :meth:`last_state`).
    :ivar target: the :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget` the draws belong to (``None`` for
        draws restored without it: :meth:`predict` and ``resume`` then need :meth:`from_state_dict` with the sampler).
    :ivar hyperparameters: draws of every sampled hyper-parameter, ``(chains, draws, *shape)``, under its
        constrained name: the prior's (``sample_hyperparameters=True``; the model's names, e.g.
        ``covar_module.base_kernel.lengthscale``) and the likelihood's constants where its Gibbs sweep samples them
        (e.g. ``rate_scale``); empty otherwise.

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior
        >>> x = torch.linspace(-2, 2, 8, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double())
        >>> samples = sampler.sample(20, warmup=10, num_chains=2, seed=0, progress=False)
        >>> samples.num_chains, samples.num_draws, samples.f.shape
        (2, 20, torch.Size([2, 20, 8]))
        >>> from gpytorch_augment import PosteriorSamples
        >>> PosteriorSamples.from_state_dict(samples.state_dict(), sampler=sampler).f.equal(samples.f)
        True
    """

    f: Tensor
    aux: AuxDict
    u: Tensor | None
    seed: int | None
    warmup: int
    thin: int
    f_update: str
    jitter: float
    elapsed: float
    num_sweeps: int
    last: ChainState
    hyperparameters: dict[str, Tensor] = field(default_factory=dict)
    target: PosteriorTarget | None = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------------ shape and state
    @property
    def num_chains(self) -> int:
        return int(self.f.shape[0])

    @property
    def num_draws(self) -> int:
        return int(self.f.shape[1])

    def last_state(self) -> ChainState:
        """The chain state after the last transition; pass it as ``init`` to continue (see also ``resume``)."""
        return self.last

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild this object (draws, settings, last state), for ``torch.save``."""
        return {
            "f": self.f,
            "aux": dict(self.aux),
            "u": self.u,
            "seed": self.seed,
            "warmup": self.warmup,
            "thin": self.thin,
            "f_update": self.f_update,
            "jitter": self.jitter,
            "elapsed": self.elapsed,
            "num_sweeps": self.num_sweeps,
            "last": self.last.state_dict(),
            "hyperparameters": dict(self.hyperparameters),
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any], sampler: Any = None) -> PosteriorSamples:
        """Inverse of :meth:`state_dict`; pass the ``sampler`` (or its :class:`PosteriorTarget`) to enable
        :meth:`predict` and resuming.

        ``ValueError`` if a key is missing, a draw is not finite, or the draws do not fit ``sampler`` (another number
        of data points, latents or inducing points)."""
        check_state_keys("state", state, ("f", "aux", "warmup", "thin", "last"))
        check_finite_state("state", {k: state.get(k) for k in ("f", "aux", "u", "last")})
        samples = cls(
            f=state["f"],
            aux=dict(state["aux"]),
            u=state.get("u"),
            seed=state.get("seed"),
            warmup=int(state["warmup"]),
            thin=int(state["thin"]),
            f_update=state.get("f_update", "auto"),
            jitter=float(state.get("jitter", 0.0)),
            elapsed=float(state.get("elapsed", 0.0)),
            num_sweeps=int(state.get("num_sweeps", 0)),
            last=ChainState.from_state_dict(state["last"]),
            hyperparameters=dict(state.get("hyperparameters", state.get("hyper")) or {}),
            target=getattr(sampler, "target", sampler),
        )
        if samples.target is not None:
            samples.check_fits(samples.target, "the state")
        return samples

    def check_fits(self, target: PosteriorTarget, what: str = "the draws") -> None:
        """``ValueError`` unless the draws have the layout of ``target``'s: latents, data points, inducing points."""
        T, n = target.num_latents, int(target.x.shape[-2])
        expected = (n,) if T == 1 else (T, n)
        if self.f.dim() < 2 or tuple(self.f.shape[2:]) != expected:
            raise ValueError(
                f"{what} holds draws of f of shape {tuple(self.f.shape)} (chains, draws, ...) but the sampler has "
                f"{'N' if T == 1 else '(T, N)'} = {expected}: pass the sampler the draws were made with"
            )
        m = target.num_inducing
        if (self.u is None) != (m is None) or (m is not None and self.u.shape[-1] != m):
            raise ValueError(
                f"{what} holds inducing values u of shape {None if self.u is None else tuple(self.u.shape)} but the "
                f"sampler has {'no' if m is None else m} inducing points: pass the sampler the draws were made with"
            )

    @classmethod
    def cat(cls, runs: Sequence[PosteriorSamples], dim: str = "draw") -> PosteriorSamples:
        """Concatenate runs along ``"draw"`` (a run and its continuation) or ``"chain"`` (independent runs,
        e.g. different seeds). The settings and sampler of the first run are kept; for ``"draw"`` the last
        state is the last run's, for ``"chain"`` the chains' last states are concatenated."""
        if dim not in ("draw", "chain"):
            raise ValueError(f"dim must be 'draw' or 'chain', got {dim!r}")
        if not runs:
            raise ValueError("cat needs at least one PosteriorSamples")
        axis = 1 if dim == "draw" else 0
        first = runs[0]
        other = 0 if dim == "draw" else 1  # the chains (draws) of every run must agree
        for i, run in enumerate(runs[1:], 1):
            same = run.f.shape[2:] == first.f.shape[2:] and run.f.shape[other] == first.f.shape[other]
            same = same and sorted(run.aux) == sorted(first.aux) and (run.u is None) == (first.u is None)
            same = same and (run.u is None or run.u.shape[2:] == first.u.shape[2:])
            if not same:
                raise ValueError(
                    f"cat along {dim!r}: run {i} has draws f of shape {tuple(run.f.shape)}, u "
                    f"{None if run.u is None else tuple(run.u.shape)}, aux {sorted(run.aux)}; run 0 has "
                    f"{tuple(first.f.shape)}, u {None if first.u is None else tuple(first.u.shape)}, aux "
                    f"{sorted(first.aux)} (runs of the same sampler, with as many "
                    f"{'chains' if dim == 'draw' else 'draws'}, concatenate)"
                )
            if first.target is not None and run.target is not None and run.target is not first.target:
                run.check_fits(first.target, f"run {i}")
        cat = lambda ts: torch.cat(list(ts), dim=axis)  # noqa: E731
        aux = {k: cat(r.aux[k] for r in runs) for k in first.aux}
        u = cat(r.u for r in runs) if first.u is not None else None
        if dim == "draw":
            last = runs[-1].last
            seed, sweeps = first.seed, sum(r.num_sweeps for r in runs)
        else:
            last = ChainState(
                f=torch.cat([r.last.f for r in runs]),
                aux={k: torch.cat([r.last.aux[k] for r in runs]) for k in first.last.aux},
                u=torch.cat([r.last.u for r in runs]) if first.last.u is not None else None,
                rng_state=None,
                num_sweeps=first.last.num_sweeps,
                hyper={  # per-chain values (sampled constants and hyper-parameters) join; shared ones do not
                    k: torch.cat([r.last.hyper[k] for r in runs])
                    for k in first.last.hyper
                    if all(
                        k in r.last.hyper and r.last.hyper[k].dim() >= 1 and r.last.hyper[k].shape[0] == r.num_chains
                        for r in runs
                    )
                },
                step_size=(
                    torch.cat([r.last.step_size for r in runs])
                    if all(r.last.step_size is not None for r in runs)
                    else None
                ),
                trajectory_length=first.last.trajectory_length,  # one length for the joined chains: the first's
                scale=first.last.scale,
                tuning=dict(first.last.tuning),  # shared by the chains: the first run's
                coordinates=(
                    torch.cat([r.last.coordinates for r in runs], dim=1)
                    if all(isinstance(r.last.coordinates, Tensor) for r in runs)
                    and len({r.last.coordinates.shape[::2] for r in runs}) == 1
                    else None
                ),
            )
            seed, sweeps = None, first.num_sweeps
        return cls(
            f=cat(r.f for r in runs),
            aux=aux,
            u=u,
            seed=seed,
            warmup=first.warmup,
            thin=first.thin,
            f_update=first.f_update,
            jitter=first.jitter,
            elapsed=sum(r.elapsed for r in runs),
            num_sweeps=sweeps,
            last=last,
            hyperparameters={k: cat(r.hyperparameters[k] for r in runs) for k in first.hyperparameters},
            target=first.target,
        )

    # ------------------------------------------------------------------ diagnostics
    def _variable(self, var: str) -> Tensor:
        if var == "f":
            return self.f
        if var == "u":
            if self.u is None:
                raise ValueError("no draws of u: the sampler has no inducing points")
            return self.u
        if var in self.aux:
            return self.aux[var]
        if var in self.hyperparameters:
            return self.hyperparameters[var]
        names = sorted(self.aux) + sorted(self.hyperparameters)
        raise ValueError(f"unknown variable {var!r}; choose 'f', 'u' or one of {names}")

    def summary(self, var: str = "f") -> PosteriorSummary:
        r"""Posterior mean, sd, 5 % and 95 % quantiles, bulk, tail and sd ESS and rank-normalised split-:math:`\hat R`
        per coordinate of ``var`` (``"f"``, ``"u"``, an auxiliary variable or a sampled likelihood hyper-parameter),
        printed as a table whose columns are the attributes of :class:`PosteriorSummary`. :math:`\hat R` needs at
        least 4 draws (and is computed from split chains, so it is meaningful with a single chain too). Coordinates
        whose draws are all equal (an auxiliary variable fixed at 0 where its factor is absent, as ``omega_upper`` for
        the ordinal likelihood's top class) have no :math:`\hat R` or ESS (NaN): :attr:`PosteriorSummary.constant`
        marks them and the printed table says so in a note."""
        draws = self._variable(var)
        C, S = draws.shape[:2]
        if S < 4:
            raise ValueError(f"summary needs at least 4 draws per chain, got {S}")
        flat = draws.detach().to("cpu", torch.float64).reshape(C, S, -1).numpy()
        shape = draws.shape[2:]
        as_t = lambda a: torch.as_tensor(a, dtype=torch.float64).reshape(shape)  # noqa: E731
        return PosteriorSummary(
            mean=as_t(flat.mean(axis=(0, 1))),
            sd=as_t(flat.reshape(C * S, -1).std(axis=0, ddof=1)),
            rhat=as_t(rank_normalized_rhat(flat)),
            ess_bulk=as_t(bulk_ess(flat)),
            ess_tail=as_t(tail_ess(flat)),
            ess_sd=as_t(sd_ess(flat)),
            q05=as_t(np.quantile(flat.reshape(C * S, -1), 0.05, axis=0)),
            q95=as_t(np.quantile(flat.reshape(C * S, -1), 0.95, axis=0)),
            name=var,
            constant=torch.as_tensor(flat.min(axis=(0, 1)) == flat.max(axis=(0, 1))).reshape(shape),
        )

    def to_arviz(self):
        """The draws as ``arviz.InferenceData`` (posterior group: ``f``, ``u``, and each auxiliary variable)."""
        try:
            import arviz as az
        except ImportError as err:
            raise ImportError(
                "PosteriorSamples.to_arviz needs the optional package 'arviz': pip install arviz "
                "(or pip install gpytorch-augment[gibbs])"
            ) from err
        to_np = lambda t: t.detach().to("cpu").numpy()  # noqa: E731
        latent = ["latent"] if self.f.dim() == 4 else []
        posterior = {"f": to_np(self.f)}
        dims = {"f": latent + ["data"]}
        if self.u is not None:
            posterior["u"] = to_np(self.u)
            dims["u"] = latent + ["inducing"]
        for name, value in list(self.aux.items()) + list(self.hyperparameters.items()):
            key = name if name not in posterior else f"aux_{name}"
            posterior[key] = to_np(value)
        attrs = {"warmup": self.warmup, "thin": self.thin, "f_update": self.f_update, "jitter": self.jitter}
        if self.seed is not None:
            attrs["seed"] = int(self.seed)
        idata = az.from_dict(posterior=posterior, dims=dims)
        idata.posterior.attrs.update(attrs)
        return idata

    # ------------------------------------------------------------------ prediction
    @with_linalg_advice("prediction")
    @torch.no_grad()
    def predict(
        self,
        x_new: Tensor,
        generator: torch.Generator | None = None,
        joint: bool = True,
        chunk_size: int | None = None,
        **kwargs: Any,
    ) -> PosteriorPrediction:
        r"""Posterior predictive at ``x_new`` as a mixture of GP conditionals over the stored draws.

        Exact model: :math:`\frac1S\sum_s \mathcal N\big(f_* \mid \mu_* + K_{*X}K^{-1}(f^{(s)} - \mu_0),\
        K_{**} - K_{*X}K^{-1}K_{X*}\big)`; sparse model: :math:`f_* \mid u^{(s)}` (:doc:`/maths/engines`).
        Draws of the prior's hyper-parameters (``sample_hyperparameters=True``, recorded in :attr:`hyperparameters`
        under the model's names) are integrated over: draw :math:`s` conditions at its own :math:`\theta_s`, with
        :math:`\mu_*, K_{*X}, K, K_{**}` evaluated at :math:`\theta_s` (batched over draws, in chunks of about
        :math:`2^{22}` kernel entries).
        :math:`y_*` is predicted with the **original** likelihood: ``likelihood.marginal`` of each conditional,
        averaged over draws (not for a likelihood with linear observations, e.g. comparisons, whose targets read
        several points: ``y_mean`` and ``y_probs`` are then ``None``; use ``f_draws``).

        :param x_new: ``(N*, D)`` inputs.
        :param generator: for the draws of :math:`f_*`.
        :param joint: draw :math:`f_*` jointly over ``x_new`` (a Cholesky factorisation of the
            :math:`N_* \times N_*` conditional covariance, in the sampler's ``linalg_dtype``) or independently per
            point (``False``: nothing is factorised). Only ``f_draws`` depends on it: ``f_mean``, ``f_var``,
            ``y_mean`` and ``y_probs`` are computed from the per-point conditionals either way, so pass
            ``joint=False`` when only they are wanted (cheaper for large :math:`N_*`, and it cannot fail).
        :param chunk_size: draws per call of ``likelihood.marginal`` (default: about :math:`2^{20}/N_*`); where the
            likelihood's constants were recorded (:attr:`hyperparameters`), a call takes only consecutive draws with
            equal values (one draw per call where they were sampled), each with its own values.
        :param kwargs: per-datum keyword data of the likelihood at ``x_new`` (e.g. binomial ``trials``), passed to
            ``likelihood.marginal``.
        :raises ValueError: for a ``chunk_size`` that is not a positive integer.
        :raises TypeError: for a keyword the likelihood does not take as per-datum data.
        """
        target = self._checked_target(x_new)
        if chunk_size is not None and (
            isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
        ):
            raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
        check_target_keywords(target.likelihood, kwargs, "predict")
        sampled = self.prior_parameter_names()
        if sampled:
            return self._predict_over_hyperparameters(x_new, sampled, generator, joint, chunk_size, kwargs)
        mu_new, P, cov, var = target.conditional_terms(x_new.to(target.x.dtype))
        w = target.conditioning_values(self.f.flatten(0, 1), None if self.u is None else self.u.flatten(0, 1))
        means = mu_new + (w.unsqueeze(-2) @ P).squeeze(-2)  # the conditional means, (chains * draws, T, N*)
        f_mean = means.mean(0)
        f_var = var + means.var(0, unbiased=False)
        eps = torch.randn(means.shape, generator=generator, dtype=means.dtype, device=means.device)
        if joint:
            advice = "the joint draws of predict (joint=False draws f_* per point and factorises nothing)"
            with warnings.catch_warnings(), linalg_advice(advice):  # the conditional covariance is singular where
                warnings.simplefilter("ignore", NumericalWarning)  # x_new repeats or meets the data: GPyTorch's
                Lc = psd_safe_cholesky(add_to_diagonal(cov.clone(), target.jitter))  # added jitter is expected
            f_draws = means + vecmat(eps, Lc.mT)
        else:
            f_draws = means + var.sqrt() * eps
        y_mean, y_probs = self._averaged_marginal(means, var, chunk_size, kwargs)

        def shaped(t: Tensor) -> Tensor:
            return target.to_storage(t).to(target.dtype)

        return PosteriorPrediction(
            f_mean=shaped(f_mean),
            f_var=shaped(f_var),
            f_draws=shaped(f_draws).reshape((self.num_chains, self.num_draws) + shaped(f_mean).shape),
            y_mean=y_mean,
            y_probs=y_probs,
        )

    def prior_parameter_names(self) -> list[str]:
        """The names in :attr:`hyperparameters` that are the prior's hyper-parameters (the model's parameters,
        sampled with ``sample_hyperparameters=True``), not the likelihood's constants; empty without a target."""
        if self.target is None or not self.hyperparameters:
            return []
        names = model_parameter_names(self.target.evaluation_model)
        return [name for name in self.hyperparameters if name in names]

    def _predict_over_hyperparameters(
        self,
        x_new: Tensor,
        sampled: list[str],
        generator: torch.Generator | None,
        joint: bool,
        chunk_size: int | None,
        kwargs: Mapping[str, Any],
    ) -> PosteriorPrediction:
        """:meth:`predict` with draws of the prior's hyper-parameters: each draw's conditional at its own
        :math:`\\theta_s`, the prior evaluated at a chunk of draws at once. The conditioning points are the inputs
        (exact model, on :math:`f^{(s)}`) or the inducing inputs (on :math:`u^{(s)}`: :math:`f_* \\mid u^{(s)}`,
        :math:`K_{ZZ} + \\epsilon I` at :math:`\\theta_s`)."""
        target = self.target
        dt, T, jitter = target.linalg_dtype, target.num_latents, target.jitter
        params = PriorParameters(target, names=sampled)
        n_draws = self.num_chains * self.num_draws
        theta = params.from_constrained({k: self.hyperparameters[k].flatten(0, 1) for k in sampled}, n_draws)
        x = target.inducing_points.to(target.x) if target.is_sparse else target.x
        x_new = x_new.to(target.x.dtype)
        if x.shape[:-2] != x_new.shape[:-2]:
            batch = torch.broadcast_shapes(x.shape[:-2], x_new.shape[:-2])
            x, x_new = x.expand(*batch, *x.shape[-2:]), x_new.expand(*batch, *x_new.shape[-2:])
        n, n_new = x.shape[-2], x_new.shape[-2]
        x_all = torch.cat([x, x_new], dim=-2)
        values = self.u if target.is_sparse else self.f
        if values is None:
            raise ValueError("predict with inducing points needs the draws of u (PosteriorSamples.u)")
        f = values.flatten(0, 1).to(dt).reshape(n_draws, T, n)
        eps = torch.randn((n_draws, T, n_new), generator=generator, dtype=dt, device=f.device)
        step = max(1, (1 << 22) // (T * (n + n_new) ** 2))
        means, variances, f_draws = [], [], []
        for start in range(0, n_draws, step):
            mean, covar, _ = params.evaluate(theta[start : start + step], x_all, log_prior=False)
            K = add_to_diagonal((covar[..., :n, :n] + covar[..., :n, :n].mT) / 2, jitter)
            L = psd_safe_cholesky(K)
            W = tri_solve(L, covar[..., :n, n:])  # L^{-1} K_{X,new}
            cov = covar[..., n:, n:] - W.mT @ W
            P = tri_solve(L.mT, W, upper=True)  # K^{-1} K_{X,new}
            m = mean[..., n:] + ((f[start : start + step] - mean[..., :n]).unsqueeze(-2) @ P).squeeze(-2)
            var = cov.diagonal(dim1=-1, dim2=-2).clamp_min(0)
            e = eps[start : start + step]
            if joint:
                advice = "the joint draws of predict (joint=False draws f_* per point and factorises nothing)"
                with warnings.catch_warnings(), linalg_advice(advice):
                    warnings.simplefilter("ignore", NumericalWarning)
                    Lc = psd_safe_cholesky(add_to_diagonal(cov.clone(), jitter))
                f_draws.append(m + (e.unsqueeze(-2) @ Lc.mT).squeeze(-2))
            else:
                f_draws.append(m + var.sqrt() * e)
            means.append(m)
            variances.append(var)
        means_all, var_all = torch.cat(means), torch.cat(variances)
        f_mean = means_all.mean(0)
        f_var = var_all.mean(0) + means_all.var(0, unbiased=False)
        y_mean, y_probs = self._averaged_marginal(means_all, var_all, chunk_size, kwargs)

        def shaped(t: Tensor) -> Tensor:
            return target.to_storage(t).to(target.dtype)

        return PosteriorPrediction(
            f_mean=shaped(f_mean),
            f_var=shaped(f_var),
            f_draws=shaped(torch.cat(f_draws)).reshape((self.num_chains, self.num_draws) + shaped(f_mean).shape),
            y_mean=y_mean,
            y_probs=y_probs,
        )

    def _checked_target(self, x_new: Tensor) -> PosteriorTarget:
        """The target, if prediction at ``x_new`` is possible (``ValueError`` otherwise)."""
        target = self.target
        if target is None:
            raise ValueError("predict needs the sampler: rebuild with PosteriorSamples.from_state_dict(state, sampler)")
        check_finite("x_new", x_new)
        if x_new.dim() != target.x.dim() or x_new.shape[-1] != target.x.shape[-1] or x_new.shape[-2] == 0:
            raise ValueError(
                f"x_new must have shape (N*, D) with N* >= 1 and D = {target.x.shape[-1]}; got shape "
                f"{tuple(x_new.shape)}"
            )
        if target.prior_changed():
            raise ValueError(
                "the model's hyper-parameters changed since the sampler's prior was cached: the stored draws "
                "belong to the old prior; restore the parameters (or draw new samples) before predicting"
            )
        return target

    def _averaged_marginal(
        self, means: Tensor, var: Tensor, chunk_size: int | None, kwargs: Mapping[str, Any]
    ) -> tuple[Tensor | None, Tensor | None]:
        """The mean and probabilities of ``likelihood.marginal`` averaged over the draws, in chunks of draws.

        With recorded likelihood constants (:attr:`hyperparameters`, ``(C, S, *shape)``) every draw is paired with
        its own values: a chunk holds consecutive draws whose values are all equal (a constant recorded but held, e.g.
        the heteroscedastic likelihoods' ``max_precision``, gives whole chunks), because a likelihood's marginal need
        not broadcast a batch of constants against a batch of predictive distributions. ``var`` is shared by the
        draws ``(T, n)`` or per draw (sampled prior hyper-parameters, ``(draws, T, n)``)."""
        target = self.target
        if target.likelihood.linear_observations:  # an observation reads several points: no per-point predictive
            return None, None
        n_draws, n_new = means.shape[0], means.shape[-1]
        prior_names = set(self.prior_parameter_names())
        constants = {k: v for k, v in self.hyperparameters.items() if k not in prior_names}
        chunk = chunk_size or max(1, (1 << 20) // max(1, n_new * target.num_latents))
        y_mean_sum, y_probs_sum, has_mean = None, None, True
        constants = {k: v.reshape((n_draws,) + tuple(v.shape[2:])) for k, v in constants.items()}
        per_draw = var.dim() == means.dim()
        start = 0
        while start < n_draws:
            stop = start + _equal_run(constants, start, min(start + chunk, n_draws))
            var_chunk = var[start:stop] if per_draw else var
            with target.constants({k: v[start] for k, v in constants.items()}):
                y_mean_sum, y_probs_sum, has_mean = self._accumulate_marginal(
                    means[start:stop], var_chunk, kwargs, y_mean_sum, y_probs_sum, has_mean
                )
            start = stop
        y_mean = y_mean_sum / n_draws if has_mean and y_mean_sum is not None else None
        y_probs = y_probs_sum / n_draws if y_probs_sum is not None else None
        return y_mean, y_probs

    def _accumulate_marginal(
        self,
        means: Tensor,
        var: Tensor,
        kwargs: Mapping[str, Any],
        y_mean_sum: Tensor | None,
        y_probs_sum: Tensor | None,
        has_mean: bool,
    ) -> tuple[Tensor | None, Tensor | None, bool]:
        """Add ``likelihood.marginal``'s mean and probs, summed over a chunk of draws (B, T, n_new), to the sums."""
        target = self.target
        likelihood, T, out_dtype = target.likelihood, target.num_latents, target.dtype
        m = means.to(out_dtype)  # (B, T, n_new)
        v_ = var.to(out_dtype).expand_as(m)
        if T == 1:
            mvn = MultivariateNormal(m[..., 0, :], DiagLinearOperator(v_[..., 0, :]))
        else:
            mvn = MultitaskMultivariateNormal.from_batch_mvn(MultivariateNormal(m, DiagLinearOperator(v_)), task_dim=-1)
        with warnings.catch_warnings():  # the conditional variance is ~0 where x_new meets the data; GPyTorch rounds
            warnings.filterwarnings("ignore", "Negative variance", NumericalWarning)  # it up to its floor, as meant
            dist = likelihood.marginal(mvn, **kwargs)
            if has_mean:
                try:
                    part = dist.mean.sum(0)
                    y_mean_sum = part if y_mean_sum is None else y_mean_sum + part
                except NotImplementedError:
                    has_mean = False
            probs = getattr(dist, "probs", None)
        if probs is not None:
            part = probs.sum(0)
            y_probs_sum = part if y_probs_sum is None else y_probs_sum + part
        return y_mean_sum, y_probs_sum, has_mean


def _equal_run(constants: Mapping[str, Tensor], start: int, stop: int) -> int:
    """How many of the draws ``start, ..., stop - 1`` in a row, from ``start``, have the values of draw ``start`` in
    every tensor of ``constants`` (``(draws, *shape)``): at least one."""
    if not constants:
        return stop - start
    equal = [(v[start:stop] == v[start]).reshape(stop - start, -1).all(-1) for v in constants.values()]
    return int(torch.stack(equal).all(0).cumprod(0).sum())
