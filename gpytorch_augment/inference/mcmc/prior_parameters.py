r"""The GP prior's hyper-parameters as sampled coordinates, and the prior evaluated at a batch of them.

A sampler that moves the hyper-parameters :math:`\theta` of the prior :math:`\mathcal N(\mu_\theta, K_\theta)` (the
kernel's and the mean's parameters) keeps one value per chain. :class:`PriorParameters` fixes the coordinates and
evaluates everything a move needs for all chains at once:

* **coordinates**: per constrained value :math:`c` an unconstrained :math:`s` that is *logarithmic* in the
  distance to the constraint's bound, as NumPyro's ``biject_to`` chooses it: :math:`c = a + e^{s}` on
  :math:`(a, \infty)` (``Positive``, ``GreaterThan``), :math:`c = b - e^{s}` on :math:`(-\infty, b)`,
  :math:`c = a + (b - a)\,\sigma(s)` on :math:`(a, b)` (``Interval``), :math:`c = s` without a constraint (and
  GPyTorch's raw value for a constraint of another kind); flattened per chain into :math:`\theta \in \mathbb R^P`.
  GPyTorch's own raw coordinates (softplus for ``Positive``) are linear above the bound's scale, where a lengthscale's
  log-normal posterior spans decades: a sampler's moves there are far too short in one coordinate and far too long
  in another. The parameters that require grad are sampled, the others stay fixed;
* **the prior at a batch of** :math:`\theta`: ``torch.func.functional_call`` on the (``linalg_dtype``) model with
  every sampled raw parameter given a leading chain dimension and the inputs expanded to match, which gives the
  means ``(C, T, n)`` and covariances ``(C, T, n, n)`` of every chain in one call (GPyTorch's parameters broadcast:
  a lengthscale ``(C, 1, D)`` against inputs ``(C, n, D)``);
* **the log density of** :math:`\theta` in these coordinates:

  .. math::
      \log p(\theta) = \sum_{\text{priors}} \log p\big(c(\theta)\big)
        + \sum_j \log\Big\lvert \frac{\partial c_j}{\partial \theta_j} \Big\rvert ,

  the priors registered on the model (``model.named_priors()``), plus, for a lengthscale or an outputscale without
  one, the default prior of the one-call fit (:mod:`~gpytorch_augment.inference.default_priors`, held here only:
  nothing is registered on the model), evaluated at the constrained values :math:`c(\theta)`; the Jacobian of the
  elementwise maps :math:`s \mapsto c` (:math:`\log c'(s) = s` on a half-line) makes it a density of the
  coordinates.

A parameter that requires grad and shapes the prior (its gradient through ``forward(x)`` exists) but that no prior
reaches is refused up front (``ValueError`` naming it): its posterior would be improper. A parameter that requires
grad but that neither the prior nor ``forward(x)`` reads (e.g. the variational parameters of an ``ApproximateGP``
used as the prior) is left as it is.

Example::

    >>> import gpytorch, torch
    >>> from gpytorch_augment import BernoulliLogitLikelihood, GPPrior
    >>> from gpytorch_augment.inference.mcmc import PosteriorTarget
    >>> from gpytorch_augment.inference.mcmc.prior_parameters import PriorParameters
    >>> x = torch.linspace(-2, 2, 6, dtype=torch.float64).unsqueeze(-1)
    >>> kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    >>> prior = GPPrior(gpytorch.means.ZeroMean(), kernel).double()
    >>> target = PosteriorTarget(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double())
    >>> params = PriorParameters(target)                 # default priors on the lengthscale and the outputscale
    >>> params.paths
    ['covar_module.raw_outputscale', 'covar_module.base_kernel.raw_lengthscale']
    >>> [p.name for p in params.parameters]
    ['covar_module.outputscale', 'covar_module.base_kernel.lengthscale']
    >>> theta = params.initial(3)                        # (chains, P): the model's values
    >>> mean, covar, log_prior = params.evaluate(theta)
    >>> mean.shape, covar.shape, log_prior.shape
    (torch.Size([3, 1, 6]), torch.Size([3, 1, 6, 6]), torch.Size([3]))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor
from torch.func import functional_call

from ..default_priors import default_priors

__all__ = ["PriorParameter", "PriorParameters", "log_derivative", "model_parameter_names"]


class PriorParameter(NamedTuple):
    """One sampled parameter: its public ``name`` (the constrained value's, as the model names it, e.g.
    ``covar_module.base_kernel.lengthscale``), its raw parameter's ``path`` in the model, ``shape``, ``constraint``
    (``None``: the raw value is the value) and its slice ``start : start + size`` of the flat coordinates."""

    name: str
    path: str
    shape: torch.Size
    constraint: Any
    start: int
    size: int

    def constrained(self, raw: Tensor) -> Tensor:
        """The constrained value(s) of raw ones."""
        return raw if self.constraint is None else self.constraint.transform(raw)

    def raw(self, value: Tensor) -> Tensor:
        """The raw value(s) of constrained ones."""
        return value if self.constraint is None else self.constraint.inverse_transform(value)

    def value(self, s: Tensor) -> Tensor:
        """The constrained value(s) at coordinates ``s`` (module docstring)."""
        bounds = _bounds(self.constraint)
        if bounds is None:
            return self.constrained(s)
        a, b = bounds
        if a is not None and b is not None:
            return a + (b - a) * torch.sigmoid(s)
        return a + torch.exp(s) if a is not None else b - torch.exp(s)

    def coordinates(self, value: Tensor) -> Tensor:
        """The coordinates of constrained value(s): the inverse of :meth:`value`."""
        bounds = _bounds(self.constraint)
        if bounds is None:
            return self.raw(value)
        a, b = bounds
        if a is not None and b is not None:
            return torch.logit((value - a) / (b - a))
        return torch.log(value - a) if a is not None else torch.log(b - value)

    def log_slope(self, s: Tensor) -> Tensor:
        r""":math:`\log\lvert dc/ds\rvert` elementwise at coordinates ``s``."""
        bounds = _bounds(self.constraint)
        if bounds is None:
            return torch.zeros_like(s) if self.constraint is None else log_derivative(self.constraint, s)
        a, b = bounds
        if a is not None and b is not None:
            return math.log(b - a) + torch.nn.functional.logsigmoid(s) + torch.nn.functional.logsigmoid(-s)
        return s


def _bounds(constraint: Any) -> tuple[float | None, float | None] | None:
    """``(lower, upper)`` (``None``: unbounded on that side) of an enforced GPyTorch ``GreaterThan`` / ``LessThan`` /
    ``Interval`` constraint, for the coordinates of the module docstring; ``None`` for no constraint, one that is not
    enforced or one of another kind (GPyTorch's raw coordinates are then the coordinates)."""
    if constraint is None or not getattr(constraint, "enforced", True):
        return None
    lower, upper = float(constraint.lower_bound), float(constraint.upper_bound)
    if type(constraint) is gpytorch.constraints.Interval and math.isfinite(lower) and math.isfinite(upper):
        return lower, upper
    if isinstance(constraint, gpytorch.constraints.GreaterThan) and math.isfinite(lower):
        return lower, None
    if isinstance(constraint, gpytorch.constraints.LessThan) and math.isfinite(upper):
        return None, upper
    return None


class _PriorTerm(NamedTuple):
    name: str
    module: torch.nn.Module
    prior: Any
    closure: Callable[[torch.nn.Module], Tensor]
    shape: torch.Size  # of log_prob at the un-batched parameters


class _Evaluator(torch.nn.Module):
    """``forward(x)`` -> (prior mean, dense prior covariance, each prior term's log density), all evaluated while
    ``functional_call`` holds the batched parameters (dense: a lazily evaluated kernel would read the parameters after
    the call)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.terms: list[_PriorTerm] = []
        #: ``None``: the dense covariance; ``m``: only its blocks ``[:m, :m]``, ``[:m, m:]`` and the diagonal of
        #: ``[m:, m:]`` (a lazily evaluated kernel computes just these)
        self.split: int | None = None

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor | tuple[Tensor, Tensor, Tensor], list[Tensor]]:
        split = self.split
        with gpytorch.settings.lazily_evaluate_kernels(split is not None):
            prior = self.model.forward(x)
            if not isinstance(prior, MultivariateNormal):
                raise TypeError(f"model.forward(x) must return a MultivariateNormal, got {type(prior).__name__}")
            mean, lazy = prior.mean, prior.lazy_covariance_matrix
            if split is None:
                covar = lazy.to_dense()
            else:
                covar = (
                    lazy[..., :split, :split].to_dense(),
                    lazy[..., :split, split:].to_dense(),
                    lazy.diagonal(dim1=-2, dim2=-1)[..., split:],
                )
        return mean, covar, [_log_prob(t) for t in self.terms]


def _log_prob(term: _PriorTerm) -> Tensor:
    """A prior term's log density at the module's value; NaN (density 0 where the evaluation reads it) for a value
    outside the prior's support, e.g. a positive parameter whose value underflowed to 0 at an extreme proposal."""
    value = term.closure(term.module)
    try:
        return term.prior.log_prob(value)
    except ValueError:
        return torch.full_like(value, math.nan)


def _named_parameters_and_constraints(model: torch.nn.Module) -> Iterator[tuple[str, Tensor, Any]]:
    if isinstance(model, gpytorch.Module):
        yield from model.named_parameters_and_constraints()
    else:
        for name, param in model.named_parameters():
            yield name, param, None


def _public_name(model: torch.nn.Module, path: str, param: Tensor, constraint: Any) -> str:
    """``a.b.raw_x`` -> ``a.b.x`` where ``x`` is the constrained value (a constraint) or the parameter itself (a
    property returning it, as ``ConstantMean.constant``); else the path."""
    head, _, leaf = path.rpartition(".")
    if not leaf.startswith("raw_"):
        return path
    public = (head + "." if head else "") + leaf[len("raw_") :]
    if constraint is not None:
        return public
    module = model.get_submodule(head) if head else model
    try:
        same = getattr(module, leaf[len("raw_") :], None) is param
    except Exception:  # noqa: BLE001 - a property that cannot be read is no alias
        same = False
    return public if same else path


def model_parameter_names(model: Any) -> dict[str, str]:
    """``{public name: raw path}`` of every parameter of ``model`` (see :class:`PriorParameter`)."""
    if not isinstance(model, torch.nn.Module):
        return {}
    return {
        _public_name(model, path, param, constraint): path
        for path, param, constraint in _named_parameters_and_constraints(model)
    }


def _log_slope(transform: Any, z: Tensor) -> Tensor | None:
    """:math:`\\log t'(z)` of GPyTorch's usual constraint transforms (softplus, sigmoid, exp), else ``None``."""
    if isinstance(transform, torch.nn.Softplus):  # (1/beta) log(1 + e^{beta z}), linear above the threshold
        bz = transform.beta * z
        return torch.where(bz > transform.threshold, torch.zeros_like(z), torch.nn.functional.logsigmoid(bz))
    if transform is torch.nn.functional.softplus:
        return torch.nn.functional.logsigmoid(z)
    if transform in (torch.sigmoid, torch.nn.functional.sigmoid):
        return torch.nn.functional.logsigmoid(z) + torch.nn.functional.logsigmoid(-z)
    if transform is torch.exp:
        return z
    return None


def log_derivative(constraint: Any, raw: Tensor) -> Tensor:
    r""":math:`\log\lvert c'(r)\rvert` elementwise for a GPyTorch constraint :math:`c` (``transform``) at raw values
    ``raw``: in closed form for ``GreaterThan`` / ``Positive`` / ``LessThan`` / ``Interval`` with softplus, sigmoid or
    exp transforms, by autograd otherwise.

    Example::

        >>> import torch
        >>> from gpytorch.constraints import Positive
        >>> from gpytorch_augment.inference.mcmc.prior_parameters import log_derivative
        >>> r = torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64)
        >>> torch.allclose(log_derivative(Positive(), r), torch.sigmoid(r).log())   # softplus' = sigmoid
        True
    """
    if not getattr(constraint, "enforced", True):
        return torch.zeros_like(raw)
    transform = getattr(constraint, "_transform", None)
    if isinstance(constraint, gpytorch.constraints.GreaterThan):
        value = _log_slope(transform, raw)
    elif isinstance(constraint, gpytorch.constraints.LessThan):
        value = _log_slope(transform, -raw)
    elif type(constraint) is gpytorch.constraints.Interval:
        value = _log_slope(transform, raw)
        if value is not None:
            value = value + torch.log(constraint.upper_bound - constraint.lower_bound).to(raw)
    else:
        value = None
    if value is not None:
        return value
    with torch.enable_grad():
        r = raw.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(constraint.transform(r).sum(), r)
    return grad.abs().log()


class PriorParameters:
    r"""The sampled hyper-parameters of a :class:`~gpytorch_augment.inference.mcmc.PosteriorTarget`'s prior
    (module docstring): coordinates, their log prior density, and the prior evaluated at a batch of them.

    :param target: the posterior target (its ``evaluation_model`` is evaluated; the model is never modified).
    :param names: ``None`` (sampling): every parameter that requires grad and that a prior reaches, with the
        priors (refusing one that shapes the prior without a prior); or the public names of the parameters to
        evaluate at given values (prediction at recorded draws: no priors, :meth:`evaluate` without ``log_prior``).

    :raises ValueError: naming a parameter without a prior, or when there is nothing to sample.
    """

    def __init__(self, target: Any, names: Sequence[str] | None = None) -> None:
        model = target.evaluation_model
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"sampling hyper-parameters needs a torch.nn.Module model, got {type(model).__name__}")
        self.target, self.model = target, model
        self.dtype = target.linalg_dtype
        self._evaluator = _Evaluator(model)
        table = list(_named_parameters_and_constraints(model))
        originals = dict(target.model.named_parameters()) if isinstance(target.model, torch.nn.Module) else {}
        x = self._inputs(target.x)
        if names is None:
            self._evaluator.terms = self._prior_terms(x)
            picked = self._reached(table, originals, x)
        else:
            public = {_public_name(model, path, param, c): (path, param, c) for path, param, c in table}
            unknown = sorted(set(names) - set(public))
            if unknown:
                raise ValueError(f"the model has no parameters {unknown}")
            picked = [public[name] for name in names]
        self.parameters: list[PriorParameter] = []
        start = 0
        for path, param, constraint in picked:
            name = _public_name(model, path, param, constraint)
            self.parameters.append(PriorParameter(name, path, param.shape, constraint, start, param.numel()))
            start += param.numel()
        #: the number of coordinates :math:`P`
        self.size = start
        with torch.no_grad():
            mean = self._evaluator(x)[0]
        self._batch_dims = mean.dim() - 1
        self._mean_shape = mean.shape

    # ------------------------------------------------------------------ set-up
    def _inputs(self, x: Tensor) -> Tensor:
        return x.to(self.dtype) if x.is_floating_point() and x.dtype != self.dtype else x

    def _prior_terms(self, x: Tensor) -> list[_PriorTerm]:
        """The model's registered priors and the default ones of its lengthscales and outputscales."""
        terms = [
            _PriorTerm(name, module, prior, closure, torch.Size())
            for name, module, prior, closure, _ in self.model.named_priors()
        ] if isinstance(self.model, gpytorch.Module) else []  # fmt: skip
        for p in default_priors(self.model, self.target.x):
            raw = getattr(p.module, f"raw_{p.parameter}")
            terms.append(
                _PriorTerm(
                    f"{p.name}_prior (default)",
                    p.module,
                    p.prior.to(raw),
                    lambda module, attr=p.parameter: getattr(module, attr),
                    torch.Size(),
                )
            )
        #: the priors of :math:`\theta`, ``{name: description}`` (defaults marked ``(default)``)
        self.priors = {t.name: repr(t.prior) for t in terms}
        self._evaluator.terms = terms
        with torch.no_grad():
            log_probs = self._evaluator(x)[2]
        return [t._replace(shape=lp.shape) for t, lp in zip(terms, log_probs)]

    def _reached(
        self, table: list[tuple[str, Tensor, Any]], originals: Mapping[str, Tensor], x: Tensor
    ) -> list[tuple[str, Tensor, Any]]:
        """The parameters that require grad and that a prior reaches; ``ValueError`` for one that shapes the prior
        (``forward(x)`` depends on it) without one."""
        free = [(p, param, c) for p, param, c in table if originals.get(p, param).requires_grad]
        if not free:
            raise ValueError(
                "sample_hyperparameters=True, but no parameter of the model requires grad: nothing to sample (the "
                "parameters with requires_grad=False stay fixed)"
            )
        params = [param for _, param, _ in free]
        with torch.enable_grad():
            mean, covar, log_probs = self._evaluator(x)
            log_prior = sum((lp.sum() for lp in log_probs), mean.new_zeros(()))
            by_prior = (
                torch.autograd.grad(log_prior, params, allow_unused=True, retain_graph=True)
                if log_prior.requires_grad
                else [None] * len(params)
            )
            shape = mean.sum() + covar.sum()
            by_forward = (
                torch.autograd.grad(shape, params, allow_unused=True)
                if shape.requires_grad
                else [None] * len(params)
            )
        picked = []
        for (path, param, constraint), prior_grad, forward_grad in zip(free, by_prior, by_forward):
            if prior_grad is not None:
                picked.append((path, param, constraint))
            elif forward_grad is not None:
                name = _public_name(self.model, path, param, constraint)
                raise ValueError(
                    f"sample_hyperparameters=True: the model's parameter {name!r} requires grad and shapes the prior, "
                    "but no prior reaches it (neither a prior registered on the model nor a default one, which exist "
                    "for lengthscales and outputscales only). Register a proper prior on it (e.g. "
                    "ConstantMean(constant_prior=gpytorch.priors.NormalPrior(0.0, 1.0))) or keep it fixed with "
                    f"{path}.requires_grad_(False)"
                )
        if not picked:
            raise ValueError(
                "sample_hyperparameters=True, but no parameter that requires grad is reached by a prior: nothing to "
                "sample"
            )
        return picked

    # ------------------------------------------------------------------ coordinates
    @property
    def paths(self) -> list[str]:
        """The raw parameters' paths in the model, in the order of the coordinates."""
        return [p.path for p in self.parameters]

    def initial(self, num_chains: int) -> Tensor:
        """The model's current values as coordinates, ``(num_chains, P)``."""
        flat = [p.coordinates(p.constrained(self.model.get_parameter(p.path).detach())).reshape(-1)
                for p in self.parameters]  # fmt: skip
        theta = torch.cat(flat).to(self.dtype)
        return theta.expand(num_chains, -1).clone()

    def _split(self, theta: Tensor) -> list[Tensor]:
        C = theta.shape[0]
        return [theta[:, p.start : p.start + p.size].reshape((C,) + p.shape) for p in self.parameters]

    def unflatten(self, theta: Tensor) -> dict[str, Tensor]:
        """Coordinates ``(C, P)`` -> ``{path: raw value (C, *shape)}`` (the values GPyTorch's modules hold)."""
        return {p.path: p.raw(p.value(s)) for p, s in zip(self.parameters, self._split(theta))}

    def constrained(self, theta: Tensor) -> dict[str, Tensor]:
        """Coordinates ``(C, P)`` -> ``{public name: constrained value (C, *shape)}``."""
        return {p.name: p.value(s) for p, s in zip(self.parameters, self._split(theta))}

    def from_constrained(self, values: Mapping[str, Tensor], num_chains: int) -> Tensor:
        """``{public name: constrained value}`` (each ``(*shape)`` or ``(C or 1, *shape)``) -> coordinates
        ``(num_chains, P)``; ``ValueError`` naming a missing or misshapen entry."""
        parts = []
        for p in self.parameters:
            if p.name not in values:
                raise ValueError(f"the state holds no value of the sampled hyper-parameter {p.name!r}")
            value = torch.as_tensor(values[p.name], dtype=self.dtype, device=self.target.device)
            if value.shape == p.shape:
                value = value.unsqueeze(0)
            if value.dim() != len(p.shape) + 1 or value.shape[1:] != p.shape or value.shape[0] not in (1, num_chains):
                raise ValueError(
                    f"the state's {p.name!r} must have shape {tuple(p.shape)} or (chains, *{tuple(p.shape)}) with "
                    f"chains = 1 or {num_chains}; got {tuple(value.shape)}"
                )
            parts.append(p.coordinates(value.expand((num_chains,) + p.shape)).reshape(num_chains, -1))
        return torch.cat(parts, dim=-1)

    # ------------------------------------------------------------------ evaluation
    def _batched_inputs(self, x: Tensor, num_chains: int) -> Tensor:
        """``x`` ``(n, D)`` (or ``(T, n, D)``) expanded to the chains and the model's batch dimensions."""
        pad = max(0, self._batch_dims - (x.dim() - 2))
        shape = (1,) * (1 + pad) + tuple(x.shape)
        return x.reshape(shape).expand((num_chains,) + shape[1:])

    def log_jacobian(self, theta: Tensor) -> Tensor:
        r""":math:`\sum_j \log\lvert\partial c_j / \partial\theta_j\rvert` per chain, ``(C,)`` (the maps
        :math:`s \mapsto c` act elementwise: their Jacobians are diagonal; :meth:`PriorParameter.log_slope`)."""
        total = theta.new_zeros(theta.shape[0])
        for p, s in zip(self.parameters, self._split(theta)):
            total = total + p.log_slope(s).reshape(theta.shape[0], -1).sum(-1)
        return total

    def evaluate(
        self, theta: Tensor, x: Tensor | None = None, log_prior: bool = True, grad: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        r"""The prior at coordinates ``theta`` ``(C, P)`` and inputs ``x`` (default: the training inputs):

        :return: ``(mean (C, T, n), covariance (C, T, n, n), log_prior (C,))`` in ``linalg_dtype``, ``log_prior``
            the log density of :math:`\theta` (module docstring; ``None`` with ``log_prior=False``). Nothing is
            factorised or jittered.
        :param grad: keep autograd's graph from ``theta`` (a gradient-based move); by default nothing is recorded.
        :raises ValueError: when the model does not evaluate at a batch of parameters.
        """
        mean, (covar,), log_p = self._evaluate(theta, self.target.x if x is None else x, log_prior, None, grad)
        return mean, covar, log_p

    def evaluate_blocks(
        self, theta: Tensor, x: Tensor, num_first: int, log_prior: bool = True, grad: bool = False
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        r"""As :meth:`evaluate` at inputs ``x = cat[Z, X]`` (``Z`` the first ``num_first`` rows), but only the
        blocks an inducing-point model needs: ``(mean (C, T, m + n), K_ZZ (C, T, m, m), K_ZX (C, T, m, n),
        diag K_XX (C, T, n), log_prior)``. A lazily evaluated kernel (GPyTorch's) computes just these, not the
        :math:`(m + n)^2` matrix. ``grad`` as :meth:`evaluate`'s."""
        mean, (K_ZZ, K_ZX, k_diag), log_p = self._evaluate(theta, x, log_prior, num_first, grad)
        return mean, K_ZZ, K_ZX, k_diag, log_p

    def _evaluate(
        self, theta: Tensor, x: Tensor, log_prior: bool, split: int | None, grad: bool = False
    ) -> tuple[Tensor, tuple[Tensor, ...], Tensor | None]:
        C, T = theta.shape[0], self.target.num_latents
        x = self._inputs(x)
        n = x.shape[-2]
        raw = {"model." + path: value for path, value in self.unflatten(theta).items()}
        self._evaluator.split = split
        try:
            with torch.enable_grad() if grad else torch.no_grad():
                mean, covar, log_probs = functional_call(self._evaluator, raw, (self._batched_inputs(x, C),))
        finally:
            self._evaluator.split = None
        expected = (C,) + tuple(self._mean_shape[:-1])
        if split is None:
            blocks, shapes = (covar,), [expected + (n, n)]
        else:
            m = split
            blocks, shapes = covar, [expected + (m, m), expected + (m, n - m), expected + (n - m,)]
        if tuple(mean.shape) != expected + (n,) or [tuple(b.shape) for b in blocks] != shapes:
            raise ValueError(
                f"the model does not evaluate at a batch of hyper-parameters: with a leading chain dimension of "
                f"{C} on its parameters, forward(x) gave mean {tuple(mean.shape)} and covariance "
                f"{[tuple(b.shape) for b in blocks]}, expected {expected + (n,)} and {shapes} (a model whose forward "
                "broadcasts its parameters against batched inputs, as GPyTorch's means and kernels do, is needed for "
                "sample_hyperparameters=True)"
            )
        mean, blocks = mean.to(self.dtype), tuple(b.to(self.dtype) for b in blocks)
        if self._batch_dims == 0:
            mean, blocks = mean.unsqueeze(1), tuple(b.unsqueeze(1) for b in blocks)
            if T > 1:
                mean = mean.expand(C, T, -1)
                blocks = tuple(b.expand((C, T) + b.shape[2:]) for b in blocks)
        if not log_prior:
            return mean, blocks, None
        total = self.log_jacobian(theta)
        for term, lp in zip(self._evaluator.terms, log_probs):
            if lp.shape == term.shape:  # a prior on fixed parameters: the same for every chain
                total = total + lp.sum().to(self.dtype)
            else:
                total = total + lp.reshape(C, -1).sum(-1).to(self.dtype)
        return mean, blocks, torch.where(torch.isnan(total), torch.full_like(total, -math.inf), total)
