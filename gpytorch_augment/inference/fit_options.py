r"""The options of the one-call fit (``CAVI.fit(x, y, learn_hyperparameters=True)``), as one typed object.

Every option has a documented default; an option that does not apply to the protocol the fit runs is an error,
never silently ignored. ``CAVI.fit(..., hyper_options={...})`` takes the same names as a dict.

Example::

    >>> from gpytorch_augment.inference.fit_options import FitOptions
    >>> options = FitOptions(priors=False, optimizer="scipy")
    >>> options.resolved("nested").inner_steps, options.resolved("nested").max_iter
    (3, 500)
    >>> FitOptions(lr=0.1).resolved("nested")
    Traceback (most recent call last):
    ...
    ValueError: lr applies to the stochastic protocol only (this fit runs the nested protocol)
    >>> FitOptions().resolved("subsample").subsample_size
    1000
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Literal

from .._validation import check_integer, check_real

__all__ = ["FitOptions"]

Protocol = Literal["auto", "nested", "subsample", "stochastic"]
Optimizer = Literal["torch", "scipy"]

PROTOCOLS = ("nested", "subsample", "stochastic")
#: the options of the L-BFGS protocols (the subsample protocol runs the nested one on every subsample)
_LBFGS = ("nested", "subsample")
#: which protocols an option applies to (the options not named here apply to every protocol)
_APPLIES_TO: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("inner_steps", "true_steps", "restarts", "optimizer", "max_line_search", "gtol", "elbo_bound"),
                    _LBFGS),
    **dict.fromkeys(("subsample_size", "subsample_tol", "polish_iter"), ("subsample",)),
    **dict.fromkeys(("lr", "batch_size", "num_epochs"), ("stochastic",)),
}  # fmt: skip
_NESTED_DEFAULTS: dict[str, Any] = {
    "max_iter": 500, "tol": 1e-6, "inner_steps": 3, "true_steps": 3, "restarts": 0, "optimizer": "torch",
    "max_line_search": 25, "gtol": 1e-2, "elbo_bound": False,
}  # fmt: skip
#: the defaults of the protocol-specific options (``None`` in a :class:`FitOptions` means "this default")
_DEFAULTS: dict[str, dict[str, Any]] = {
    "nested": _NESTED_DEFAULTS,
    "subsample": {**_NESTED_DEFAULTS, "subsample_size": 1000, "subsample_tol": 1e-3, "polish_iter": 10},
    "stochastic": {"max_iter": None, "tol": 1e-4, "lr": 0.05, "batch_size": 1024, "num_epochs": 20},
}


@dataclass(frozen=True)
class FitOptions:
    r"""How the one-call fit runs. ``None`` means the protocol's default (listed per option).

    **The model** (every protocol):

    :param priors: add the default hyper-priors (:mod:`~gpytorch_augment.inference.default_priors`) to every
        hyper-parameter that has no prior of the user's, and fit the maximum a posteriori (MAP) point; ``False``:
        maximum likelihood (ML-II) under the user's priors only. Default ``True``.
    :param initialise: start every lengthscale still at GPyTorch's default initial value at the data-aware point
        (the mode of its default prior); explicit initial values are kept. Default ``True``.
    :param collapse_restarts: how many times a fit that ends at a constant predictor restarts from a data-aware
        point (:mod:`~gpytorch_augment.inference.collapse`). Default 2.
    :param learn_inducing_locations: see :func:`~gpytorch_augment.inference.hyperparameters.hyperparameters_of`.

    **The protocol**: ``protocol`` is ``"auto"`` (:func:`~gpytorch_augment.inference.hyperparameters.choose_protocol`
    by the number of points), ``"nested"``, ``"subsample"`` or ``"stochastic"``.

    :param max_iter: nested and subsample: L-BFGS iterations of one run (500); stochastic: CAVI steps (none).
    :param tol: nested and subsample: the relative change of the objective between iterations that stops a run
        (``1e-6``); stochastic: the relative change of the epoch-averaged bound (``1e-4``).

    **Nested and subsample**:

    :param optimizer: ``"torch"`` (``torch.optim.LBFGS`` with a strong-Wolfe line search) or ``"scipy"``
        (SciPy's L-BFGS-B). Default ``"torch"``.
    :param inner_steps: the CAVI steps inside every evaluation of the objective (3).
    :param true_steps: natural-gradient steps of :math:`q(u)` on the true ELBO after them (3).
    :param restarts: how often a stop that fails the stationarity test goes on in polish mode (0).
    :param max_line_search: evaluations one line search may spend (25).
    :param gtol: the stationarity test: a stop is certified when every entry of the objective's gradient per
        datum, with :math:`q(u)` at its optimum, is at most this (``1e-2``).
    :param elbo_bound: where the likelihood has a cheaper lower bound of its expected log-likelihood
        (:attr:`~gpytorch_augment.likelihoods.AugmentedLikelihood.has_elbo_bound`, e.g. the logistic-softmax's Jensen
        bound) and the default convergence rule runs, first fit the objective with the bound in it, then the exact
        objective from that point; the result is judged on the exact objective either way. Off by default
        (``False``): it can be several times faster, but the exact stage can settle in a worse optimum
        (``benchmarks/README.md``).

    **Subsample only** (the ``"subsample"`` protocol of :mod:`~gpytorch_augment.inference.hyperparameters`):

    :param subsample_size: the points of the first subsample (1,000); each next one doubles it.
    :param subsample_tol: the subsamples stop growing when two doublings in a row each raise the objective per
        datum by less than this (``1e-3`` nats) and the gradient per datum on all the data, estimated from the
        subsample, is within ``gtol`` by two standard errors (or the next subsample would be all the data).
    :param polish_iter: L-BFGS iterations on all the data afterwards, run only where the stationarity test on all
        the data fails (10; 0: none).

    **Stochastic only**: ``lr`` (Adam's learning rate, 0.05), ``batch_size`` (1024), ``num_epochs`` (20).
    """

    priors: bool = True
    initialise: bool = True
    collapse_restarts: int = 2
    learn_inducing_locations: bool | None = None
    protocol: Protocol = "auto"
    max_iter: int | None = None
    tol: float | None = None
    optimizer: Optimizer | None = None
    inner_steps: int | None = None
    true_steps: int | None = None
    restarts: int | None = None
    max_line_search: int | None = None
    gtol: float | None = None
    elbo_bound: bool | None = None
    lr: float | None = None
    batch_size: int | None = None
    num_epochs: int | None = None
    subsample_size: int | None = None
    subsample_tol: float | None = None
    polish_iter: int | None = None

    def __post_init__(self) -> None:
        _check_flag("priors", self.priors)
        _check_flag("initialise", self.initialise)
        for name in ("learn_inducing_locations", "elbo_bound"):
            if getattr(self, name) is not None:
                _check_flag(name, getattr(self, name))
        if not isinstance(self.protocol, str) or self.protocol not in ("auto", *PROTOCOLS):
            raise ValueError(
                f"protocol must be one of 'auto', 'nested', 'subsample', 'stochastic', got {self.protocol!r}"
            )
        if self.optimizer is not None and self.optimizer not in ("torch", "scipy"):
            raise ValueError(f"optimizer must be 'torch' or 'scipy', got {self.optimizer!r}")
        for name, least in (("collapse_restarts", 0), ("inner_steps", 1), ("true_steps", 0), ("restarts", 0),
                            ("max_line_search", 1), ("batch_size", 1), ("num_epochs", 1), ("max_iter", 1),
                            ("subsample_size", 1), ("polish_iter", 0)):  # fmt: skip
            object.__setattr__(self, name, check_integer(name, getattr(self, name), least, optional=True))
        for name, positive in (("tol", False), ("gtol", False), ("lr", True), ("subsample_tol", False)):
            object.__setattr__(self, name, check_real(name, getattr(self, name), positive=positive, optional=True))

    @classmethod
    def from_mapping(cls, options: FitOptions | dict[str, Any] | None, **overrides: Any) -> FitOptions:
        """``options`` (a :class:`FitOptions`, a dict of its fields or ``None``) with ``overrides`` whose value is
        not ``None`` put in; ``ValueError`` naming an unknown key."""
        if options is None:
            options = cls()
        elif isinstance(options, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(options) - known)
            if unknown:
                raise ValueError(f"unknown hyper_options {unknown}; known: {sorted(known)}")
            options = cls(**options)
        elif not isinstance(options, cls):
            raise ValueError(f"hyper_options must be a FitOptions or a dict, got {type(options).__name__}")
        given = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(options, **given) if given else options

    def resolved(self, protocol: str) -> FitOptions:
        """These options for ``protocol`` (``"nested"``, ``"subsample"`` or ``"stochastic"``) with every default
        filled in; ``ValueError`` naming an option set here that the protocol does not use."""
        for name, protocols in _APPLIES_TO.items():
            if protocol not in protocols and getattr(self, name) is not None:
                which = " and ".join(protocols) + (" protocols" if len(protocols) > 1 else " protocol")
                raise ValueError(f"{name} applies to the {which} only (this fit runs the {protocol} protocol)")
        filled = {k: v for k, v in _DEFAULTS[protocol].items() if getattr(self, k) is None}
        return dataclasses.replace(self, protocol=protocol, **filled)  # type: ignore[arg-type]


def _check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
