r"""A positive law known only through its Laplace transform, exponentially tilted: draws, density and CDF by
numerical inversion of the transform (:doc:`/guide/writing_a_likelihood`).

A mixing law :math:`p(\omega)` on :math:`\omega > 0` with Laplace transform
:math:`\varphi(r) = \int_0^\infty e^{-r\omega}p(\omega)\,d\omega` (:math:`\varphi(0) = 1`) has, for every
:math:`r \ge 0`, the exponentially tilted law

.. math::
    p_r(\omega) = \frac{e^{-r\omega}\,p(\omega)}{\varphi(r)}, \qquad
    E_{p_r}\omega = -(\log\varphi)'(r), \quad \operatorname{Var}_{p_r}\omega = (\log\varphi)''(r),

whose own transform is :math:`s\mapsto\varphi(r+s)/\varphi(r)`. :class:`TiltedLaplaceTransform` is that law given
:math:`\log\varphi` alone, following Ridout (2009, "Generating random numbers from a distribution specified by its
Laplace transform"): the CDF and density are the Euler inversion (Abate & Whitt 1995,
:func:`~gpytorch_augment._numerics.euler_inversion`) of :math:`\varphi(r+s)/(s\,\varphi(r))` and
:math:`\varphi(r+s)/\varphi(r)`, and a draw solves :math:`F_r(\omega) = u` for a uniform :math:`u` by safeguarded
Newton steps in :math:`\log\omega` (:func:`~gpytorch_augment._numerics.safeguarded_newton`), vectorised over all
points at once. The inversion evaluates :math:`\log\varphi` at complex arguments with positive real part, so
:math:`\log\varphi` must be written with torch operations that accept complex tensors and give the analytic
continuation there (``exp``, ``log1p``, ``sqrt``, powers; see :func:`check_laplace_transform`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints

from .._numerics import euler_inversion
from .auxiliary import NotReparameterized

__all__ = ["TiltedLaplaceTransform", "check_laplace_transform", "log_laplace_derivatives"]

LogLaplace = Callable[[Tensor], Tensor]

#: the grid of :func:`check_laplace_transform`: 0 and 10^-6 ... 10^6
_CHECK_GRID = torch.cat([torch.zeros(1, dtype=torch.float64), torch.logspace(-6, 6, 121, dtype=torch.float64)])
#: a draw stops once its Newton step in log(omega) is below this (the inversion itself is good to ~1e-8)
_DRAW_TOL = 1e-10
#: ... or once the CDF there is this close to its uniform (below the inversion's own error)
_CDF_TOL = 1e-12
#: half-width, in log(omega), of the bracket around the starting point of a draw
_BRACKET = 40.0


def check_laplace_transform(log_phi: LogLaplace, name: str = "log_phi", *, dtype: torch.dtype = torch.float64) -> None:
    r"""Check that ``log_phi`` can be :math:`\log` of a Laplace transform :math:`\varphi(r) = E e^{-r\omega}` of a
    law on :math:`\omega \ge 0`, on the grid :math:`r \in \{0\}\cup[10^{-6}, 10^6]` (121 log-spaced points): the
    values are real and finite (:math:`\varphi(0)`, the mass of the law, finite and positive), non-increasing,
    and convex (the slopes between neighbours non-decreasing), each up to rounding. These are necessary
    conditions of complete monotonicity (Bernstein's theorem), not sufficient ones.

    :raises ValueError: naming ``name`` and saying which condition fails, and where.

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions.laplace_transform import check_laplace_transform
        >>> check_laplace_transform(lambda r: -2.0 * torch.log1p(r))          # Gamma(2, 1)
        >>> check_laplace_transform(lambda r: -r**2)
        Traceback (most recent call last):
        ...
        ValueError: log_phi is not convex: the slope falls from -0.000179 to -0.000226 near r = 0.0001 ...
    """
    grid = _CHECK_GRID.to(dtype)
    try:
        with torch.no_grad():
            values = torch.as_tensor(log_phi(grid))
    except Exception as error:  # noqa: BLE001 - any failure of the user's function is reported with its name
        raise ValueError(f"{name} must map a float tensor r >= 0 to log phi(r); calling it failed: {error}") from error
    if values.shape != grid.shape or values.is_complex():
        raise ValueError(f"{name} must return one real value per r (elementwise); got shape {tuple(values.shape)}")
    values = values.detach().to(torch.float64)
    if not bool(torch.isfinite(values[0])):
        raise ValueError(f"{name}(0) = {values[0].item()}: phi(0), the mass of the mixing law, must be finite and > 0")
    bad = ~torch.isfinite(values)
    if bad.any():
        where = grid[bad][0].item()
        raise ValueError(f"{name}(r) must be finite for r >= 0; got {values[bad][0].item()} at r = {where:.3g}")
    tol = 1e-9 * (1 + values.abs())
    rising = torch.diff(values) > tol[1:]
    if rising.any():
        k = int(rising.nonzero()[0])
        raise ValueError(
            f"{name} is not non-increasing: log phi rises from {values[k].item():.6g} at r = {grid[k].item():.3g} "
            f"to {values[k + 1].item():.6g} at r = {grid[k + 1].item():.3g} (a Laplace transform of a law on "
            "omega >= 0 decreases)"
        )
    slopes = torch.diff(values) / torch.diff(grid.to(torch.float64))
    falling = torch.diff(slopes) < -(1e-6 * slopes[:-1].abs() + 1e-9 * (1 + values[1:-1].abs()) / torch.diff(grid)[1:])
    if falling.any():
        k = int(falling.nonzero()[0])
        raise ValueError(
            f"{name} is not convex: the slope falls from {slopes[k].item():.3g} to {slopes[k + 1].item():.3g} near "
            f"r = {grid[k + 1].item():.3g} (log phi of a Laplace transform is convex: its second derivative is the "
            "variance of the tilted law)"
        )


def log_laplace_derivatives(log_phi: LogLaplace, r: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r""":math:`(\log\varphi(r), (\log\varphi)'(r), (\log\varphi)''(r))` by autograd, detached: the log-transform, minus
    the mean and the variance of the tilted law.

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions.laplace_transform import log_laplace_derivatives
        >>> value, d1, d2 = log_laplace_derivatives(lambda r: -3.0 * torch.log1p(r / 2), torch.tensor([1.0]))
        >>> -d1, d2                                              # Gamma(3, 2 + 1): mean 1, variance 1/3
        (tensor([1.]), tensor([0.3333]))
    """
    with torch.enable_grad():
        leaf = r.detach().requires_grad_(True)
        value = log_phi(leaf)
        if not value.requires_grad:  # log phi constant in r (no graph to r): a point mass at omega = 0
            zero = torch.zeros_like(leaf)
            return torch.as_tensor(value).detach(), zero, zero
        (d1,) = torch.autograd.grad(value.sum(), leaf, create_graph=True)
        (d2,) = torch.autograd.grad(d1.sum(), leaf) if d1.requires_grad else (torch.zeros_like(d1),)
    return value.detach(), d1.detach(), d2.detach()


def _tilted_transform(log_phi: LogLaplace, r: Tensor, log_phi_r: Tensor) -> Callable[[Tensor], Tensor]:
    r""":math:`s \mapsto (\varphi(r+s)/(s\varphi(r)), \varphi(r+s)/\varphi(r))`, stacked: the transforms of the tilted
    CDF and density (``s`` complex, one trailing dimension of contour points)."""

    def transform(s: Tensor) -> Tensor:
        ratio = torch.exp(log_phi(r.unsqueeze(-1) + s) - log_phi_r.unsqueeze(-1))
        return torch.stack([ratio / s, ratio])

    return transform


class TiltedLaplaceTransform(NotReparameterized, Distribution):
    r"""The tilted law :math:`p_r(\omega)\propto e^{-r\omega}p(\omega)` of a mixing law given by
    :math:`\log\varphi` alone (the module docstring gives the method).

    * :meth:`sample`: numerical inversion of the CDF, in float64 (cast back to the dtype of ``r``).
    * :meth:`log_prob`, :meth:`cdf`: Euler inversion of the density's and the CDF's transforms (error about
      :math:`10^{-8}`; where the inverted density is not positive, deep in a tail, ``log_prob`` is ``-inf``).
    * :attr:`mean`, :attr:`variance`: :math:`-(\log\varphi)'(r)` and :math:`(\log\varphi)''(r)` by autograd.

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions import TiltedLaplaceTransform
        >>> law = TiltedLaplaceTransform(lambda r: -2.0 * torch.log1p(r), torch.tensor([0.0, 3.0]))  # Gamma(2, 1 + r)
        >>> law.mean
        tensor([2.0000, 0.5000])
        >>> draws = law.sample((4000,), generator=torch.Generator().manual_seed(0))
        >>> bool(((draws.mean(0) - law.mean).abs() < 4 * (law.variance / 4000).sqrt()).all())
        True
        >>> torch.distributions.Gamma(2.0, 4.0).log_prob(torch.tensor(0.3)), law.log_prob(torch.tensor(0.3))[1]
        (tensor(0.3686), tensor(0.3686))

    :param log_phi: :math:`r\mapsto\log\varphi(r)`, elementwise, for real and complex ``r`` (real part :math:`\ge 0`).
    :param r: the tilt :math:`r \ge 0` (one law per element).
    """

    arg_constraints = {"r": constraints.nonnegative}
    support = constraints.positive
    has_rsample = False

    def __init__(self, log_phi: LogLaplace, r: Tensor | float, validate_args: bool | None = None) -> None:
        self.log_phi = log_phi
        self.r = torch.as_tensor(r, dtype=r.dtype if isinstance(r, Tensor) else torch.get_default_dtype())
        super().__init__(self.r.shape, validate_args=validate_args)

    def expand(self, batch_shape: torch.Size, _instance: Any = None) -> TiltedLaplaceTransform:
        return TiltedLaplaceTransform(self.log_phi, self.r.expand(batch_shape), validate_args=False)

    def _moments(self) -> tuple[Tensor, Tensor]:
        _, d1, d2 = log_laplace_derivatives(self.log_phi, self.r)
        return -d1, d2

    @property
    def mean(self) -> Tensor:
        return self._moments()[0]

    @property
    def variance(self) -> Tensor:
        return self._moments()[1]

    def _invert(self, value: Tensor) -> tuple[Tensor, Tensor]:
        """(CDF, density) at ``value`` (float64), by one Euler inversion."""
        x, r = torch.broadcast_tensors(value.to(torch.float64), self.r.detach().to(torch.float64))
        with torch.no_grad():
            log_phi_r = self.log_phi(r)
            safe = torch.where(x > 0, x, torch.ones_like(x))
            cdf, density = euler_inversion(_tilted_transform(self.log_phi, r, log_phi_r), safe)
        positive = x > 0
        return torch.where(positive, cdf.clamp(0.0, 1.0), torch.zeros_like(cdf)), torch.where(
            positive, density, torch.zeros_like(density)
        )

    def log_prob(self, value: Tensor | float) -> Tensor:
        value = torch.as_tensor(value, dtype=self.r.dtype, device=self.r.device)
        density = self._invert(value)[1]
        out = torch.where(density > 0, density.clamp_min(1e-300).log(), torch.full_like(density, -math.inf))
        return out.to(self.r.dtype)

    def cdf(self, value: Tensor | float) -> Tensor:
        return self._invert(torch.as_tensor(value, dtype=self.r.dtype, device=self.r.device))[0].to(self.r.dtype)

    @torch.no_grad()
    def sample(self, sample_shape: torch.Size = torch.Size(), generator: torch.Generator | None = None) -> Tensor:
        """Draws by inversion of the CDF (uniforms from ``generator``, or the global torch RNG)."""
        shape = self._extended_shape(torch.Size(sample_shape))
        r = self.r.detach().to(torch.float64).expand(shape)
        device = generator.device if generator is not None else r.device
        u = torch.rand(shape, dtype=torch.float64, device=device, generator=generator).to(r.device)
        return invert_uniforms(self.log_phi, r, u).to(self.r.dtype)


def _starting_points(log_phi: LogLaplace, r: Tensor, u: Tensor) -> Tensor:
    r"""A first guess of :math:`\log F_r^{-1}(u)`: the log-normal quantile with the law's mean and variance, or,
    where they are not finite (e.g. the Lévy law at :math:`r = 0`), :math:`-\log s_*` with
    :math:`\varphi(r + s_*) = \varphi(r)/e` found by bisection in :math:`\log s` (the law's scale)."""
    log_phi_r, d1, d2 = log_laplace_derivatives(log_phi, r)
    mean, var = -d1, d2
    sigma2 = torch.log1p(var / mean**2)
    normal_quantile = math.sqrt(2.0) * torch.erfinv(2 * u - 1)
    guess = mean.log() - sigma2 / 2 + sigma2.sqrt() * normal_quantile
    bad = ~torch.isfinite(guess)
    if bool(bad.any()):
        rb, lpb = r[bad], log_phi_r[bad]
        lo, hi = torch.full_like(rb, -60.0), torch.full_like(rb, 60.0)
        for _ in range(70):  # bisection of log phi(r + e^t) - log phi(r) + 1, decreasing in t
            mid = (lo + hi) / 2
            above = log_phi(rb + mid.exp()) - lpb + 1 > 0
            lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
        guess[bad] = -(lo + hi) / 2
    return guess


def invert_uniforms(log_phi: LogLaplace, r: Tensor, u: Tensor, max_iter: int = 60) -> Tensor:
    r""":math:`F_r^{-1}(u)` elementwise (float64 ``r``, ``u`` of one shape): the draws of
    :meth:`TiltedLaplaceTransform.sample` for given uniforms.

    Newton steps on :math:`F_r(e^z) = u` in :math:`z = \log\omega`, from the log-normal start of
    :func:`_starting_points`, each kept inside a bracket that shrinks to the side of the root (bisection where the
    step would leave it), the same safeguard as :func:`~gpytorch_augment._numerics.safeguarded_newton`; only the
    elements not yet converged are evaluated. One step costs one evaluation of :math:`\log\varphi` at
    ``EULER_TERMS + EULER_AVERAGED + 1`` = 27 complex points per element (CDF and density together); most draws
    converge in 3 to 6 steps."""
    r, u = torch.broadcast_tensors(r, u)
    shape = r.shape
    r, u = r.reshape(-1), u.reshape(-1)
    z = _starting_points(log_phi, r, u)
    lo, hi = z - _BRACKET, z + _BRACKET
    active = torch.arange(z.numel(), device=z.device)
    for _ in range(max_iter):
        if active.numel() == 0:
            break
        ra, za = r[active], z[active]
        cdf, density = euler_inversion(_tilted_transform(log_phi, ra, log_phi(ra)), za.exp())
        excess, slope = cdf - u[active], za.exp() * density
        below = excess < 0  # the root lies above z
        la, ha = torch.where(below, za, lo[active]), torch.where(below, hi[active], za)
        newton = za - excess / slope
        inside = (newton > la) & (newton < ha)
        step = torch.where(inside, newton, (la + ha) / 2)
        hit = excess.abs() <= _CDF_TOL  # as close as the inversion can tell: keep z
        step = torch.where(hit, za, step)
        converged = hit | ((step - za).abs() <= _DRAW_TOL * (1 + za.abs())) | (ha - la <= _DRAW_TOL * (1 + za.abs()))
        z[active], lo[active], hi[active] = step, la, ha
        active = active[~converged]
    return z.exp().reshape(shape)
