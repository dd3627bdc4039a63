r"""The one-call fit's default hyper-priors and its data-aware starting point.

**Lengthscales.** BoTorch (Hvarfner et al., 2024, "Vanilla Bayesian optimization performs great in high dimensions")
puts :math:`\log\ell_d \sim \mathcal N(\sqrt2 + \tfrac12\ln D,\ 3)` on the lengthscales of inputs min-max scaled to
the unit cube, :math:`D` the number of inputs the kernel reads. The fit reads that prior for inputs of any spread
through a *width* :math:`w_d` per input, the side of the cube the input is measured against:

.. math::
    \log\ell_d \sim \mathcal N\big(\sqrt2 + \tfrac12\ln D + \ln w_d,\ 3\big), \qquad
    w_d = \sqrt{12}\,s_d,

:math:`s_d` the input's standard deviation over the training points (a constant input takes :math:`s_d = 1`; one
shared lengthscale takes the root mean square of the :math:`w_d`): the range of a uniform input of that spread, so
the prior is BoTorch's for raw, standardised and unit-cube inputs alike, without the observed range's growth with
the number of points or its hold on one outlier (pilots on problems outside every reported table could not
separate it from the observed range or twice it: ``benchmarks/README.md``).
Its mode, :math:`e^{\mu_d - 3} \approx 0.2\sqrt D\,w_d \approx 0.71\sqrt D\,s_d`, is the data-aware start: a kernel
between distinct points of :math:`D \gtrsim 10` standardised inputs at GPyTorch's initial lengthscale :math:`\ln 2`
is :math:`\sim e^{-D}`, where the likelihood is best explained by a constant and the gradients vanish (Papenmeier et
al., ICML 2025, trace maximum-likelihood failures in high dimension to it).

**Outputscales.** Labels of a non-Gaussian likelihood cannot be standardised, so the outputscale stays (as in
BoTorch's ``PairwiseGP``), under :math:`\sigma^2 \sim \mathrm{Gamma}(2, \tfrac14)` (mode 4, mean 8): its density
vanishes at :math:`\sigma^2 = 0`, so a fit cannot settle at the constant predictor of a zero outputscale, and its
long right tail leaves room for the large outputscales of nearly linear functions. The rate was chosen on pilots
outside every reported table (``benchmarks/studies/prior_pilot.py``; the figures in ``benchmarks/README.md``) by
the lowest mean held-out NLL among the rates 1, ½ and ¼, a log-normal and no prior.

A default prior is added only to a hyper-parameter without a prior of the user's (a prior registered on the
kernel under GPyTorch's name, ``lengthscale_prior`` or ``outputscale_prior``, wins), and only for the duration of
the fit (:func:`registered`): the model keeps no trace of it. Likelihood constants keep their own priors (the
likelihoods that need one declare it, e.g. ``rate_scale_prior``).

Example::

    >>> import torch, gpytorch
    >>> from gpytorch_augment.inference.default_priors import default_priors
    >>> kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=16))
    >>> x = torch.randn(200, 16, generator=torch.Generator().manual_seed(0))
    >>> priors = default_priors(kernel, x)
    >>> sorted(p.name for p in priors)
    ['base_kernel.lengthscale', 'outputscale']
    >>> start = next(p.start for p in priors if p.parameter == "lengthscale")  # its mode: ~0.71 sqrt(16) s_d
    >>> bool((start > 2.3).all() and (start < 3.4).all())
    True
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import gpytorch
import torch
from gpytorch.priors import GammaPrior, LogNormalPrior, Prior
from torch import Tensor

__all__ = ["DefaultPrior", "default_priors", "initial_point", "registered", "user_priors"]

#: the lengthscale prior's standard deviation of log(lengthscale) (BoTorch's)
LENGTHSCALE_LOG_SD = math.sqrt(3.0)
#: an input's width (the side of its unit cube) in standard deviations (module docstring: chosen on pilots)
WIDTH_PER_SD = math.sqrt(12.0)
#: the outputscale prior: Gamma(concentration, rate)
OUTPUTSCALE_GAMMA = (2.0, 0.25)


@dataclass
class DefaultPrior:
    """One default prior: the module it goes on, the name of its parameter there, the prior, and (lengthscales)
    the data-aware starting value."""

    name: str
    module: gpytorch.Module
    parameter: str
    prior: Prior
    start: Tensor | None = None

    @property
    def prior_name(self) -> str:
        return f"{self.parameter}_prior"


def input_width(x: Tensor) -> Tensor:
    r"""The width of every input, ``(D,)`` in float64: the side of the unit cube it is measured against,
    :data:`WIDTH_PER_SD` times its standard deviation over the training points (1 for a constant input)."""
    flat = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
    spread = flat.std(dim=0) if flat.shape[0] > 1 else torch.ones_like(flat[0])
    return WIDTH_PER_SD * torch.where(spread > 0, spread, torch.ones_like(spread))


def _lengthscale_prior(kernel: gpytorch.kernels.Kernel, width: Tensor) -> tuple[LogNormalPrior, Tensor] | None:
    """The default prior of ``kernel``'s lengthscale and its mode (shaped like the lengthscale), or ``None`` where
    the kernel's inputs cannot be told (its lengthscale is neither one per input it reads nor one in all)."""
    active = kernel.active_dims
    w = width if active is None else width[torch.as_tensor(active, device=width.device)]
    num_inputs = w.numel()
    num_lengthscales = kernel.raw_lengthscale.shape[-1]
    if num_lengthscales == 1:
        w = w.square().mean().sqrt().reshape(1)
    elif num_lengthscales != num_inputs:
        return None
    loc = math.sqrt(2.0) + 0.5 * math.log(num_inputs) + torch.log(w)
    loc = loc.to(kernel.raw_lengthscale).expand(kernel.raw_lengthscale.shape).clone()
    scale = torch.full_like(loc, LENGTHSCALE_LOG_SD)
    return LogNormalPrior(loc, scale), (loc - LENGTHSCALE_LOG_SD**2).exp()


def outputscale_prior(raw: Tensor) -> Prior | None:
    """The default prior of an outputscale shaped like ``raw``: Gamma(:data:`OUTPUTSCALE_GAMMA`)."""
    concentration, rate = (torch.full_like(raw, v) for v in OUTPUTSCALE_GAMMA)
    return GammaPrior(concentration, rate)


def user_priors(module: torch.nn.Module) -> dict[str, str]:
    """The priors registered on ``module`` and its children, ``{name: prior}`` as text."""
    return {name: repr(prior) for name, _, prior, _, _ in module.named_priors()}


def default_priors(model: torch.nn.Module, x: Tensor) -> list[DefaultPrior]:
    """The default priors of ``model``'s kernels for the training inputs ``x`` (module docstring): one per
    lengthscale and per outputscale that has no prior of the user's."""
    width = input_width(x)
    found: list[DefaultPrior] = []
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, gpytorch.kernels.Kernel) and module.has_lengthscale:
            if "lengthscale_prior" not in module._priors:
                made = _lengthscale_prior(module, width)
                if made is not None:
                    prior, start = made
                    found.append(DefaultPrior(f"{prefix}lengthscale", module, "lengthscale", prior, start))
        if isinstance(module, gpytorch.kernels.ScaleKernel) and "outputscale_prior" not in module._priors:
            prior = outputscale_prior(module.raw_outputscale.detach())
            if prior is not None:
                found.append(DefaultPrior(f"{prefix}outputscale", module, "outputscale", prior))
    return found


def at_gpytorch_default(kernel: gpytorch.kernels.Kernel) -> bool:
    """Whether ``kernel``'s lengthscale is still at GPyTorch's initial value (every raw entry exactly 0)."""
    return bool((kernel.raw_lengthscale.detach() == 0).all())


@torch.no_grad()
def initial_point(model: torch.nn.Module, x: Tensor, force: bool = False, scale: float = 1.0) -> list[str]:
    """Set every lengthscale still at GPyTorch's initial value (``force``: every lengthscale) to the data-aware
    start, the mode of its default prior (times ``scale``); returns the names of the lengthscales it set."""
    width = input_width(x)
    names = []
    for name, module in model.named_modules():
        if isinstance(module, gpytorch.kernels.Kernel) and module.has_lengthscale:
            if force or at_gpytorch_default(module):
                made = _lengthscale_prior(module, width)
                if made is not None:
                    module._set_lengthscale((scale * made[1]).to(module.raw_lengthscale))
                    names.append(f"{name}.lengthscale" if name else "lengthscale")
    return names


@contextmanager
def registered(priors: list[DefaultPrior]) -> Iterator[None]:
    """Register ``priors`` on their modules under GPyTorch's names for the duration of the block."""
    done = []
    try:
        for p in priors:
            p.module.register_prior(p.prior_name, p.prior.to(_like(p.module, p.parameter)), *_closures(p.parameter))
            done.append(p)
        yield
    finally:
        for p in done:
            p.module._priors.pop(p.prior_name, None)
            p.module._modules.pop(p.prior_name, None)


def _closures(parameter: str) -> tuple[Any, Any]:
    """GPyTorch's prior closures for ``parameter``: read its constrained value, and set it."""

    def value(module: torch.nn.Module) -> Tensor:
        return getattr(module, parameter)

    def setting(module: gpytorch.Module, new: Tensor) -> None:
        module.initialize(**{parameter: new})

    return value, setting


def _like(module: torch.nn.Module, parameter: str) -> Tensor:
    return getattr(module, f"raw_{parameter}")
