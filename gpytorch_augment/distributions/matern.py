r"""The Matérn-3/2 noise law, the conditional :math:`p(y\mid f)` of
:class:`~gpytorch_augment.likelihoods.MaternThreeHalvesLikelihood`."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints
from torch.distributions.utils import broadcast_all

from .._random import draw_device

__all__ = ["MaternThreeHalves"]


class MaternThreeHalves(Distribution):
    r"""The density :math:`p(y) = \frac a4\,(1 + a|y - \mu|)\,e^{-a|y - \mu|}`, :math:`a = \sqrt3/\rho`: the
    Matérn-3/2 covariance function of the lengthscale :math:`\rho` read as a density in :math:`y - \mu`
    (normalised: :math:`\int(1 + a|x|)e^{-a|x|}dx = 4/a`).

    It is the equal mixture of a Laplace law (:math:`|y-\mu|\sim\mathrm{Ex}(a)`) and of :math:`|y-\mu|\sim
    \mathrm{Ga}(2, a)` with a random sign, which :meth:`sample` uses. Mean :math:`\mu`, variance
    :math:`4/a^2 = \tfrac43\rho^2`; CDF :math:`1 - \tfrac14(2 + ad)e^{-ad}` at :math:`d = y - \mu \ge 0`
    (symmetric).

    Example::

        >>> import torch
        >>> from gpytorch_augment.distributions import MaternThreeHalves
        >>> noise = MaternThreeHalves(torch.tensor(0.0), torch.tensor(0.5))
        >>> noise.variance                                        # 4 rho^2 / 3
        tensor(0.3333)
        >>> noise.cdf(torch.tensor([0.0, 10.0]))
        tensor([0.5000, 1.0000])
        >>> draws = noise.sample((40000,), generator=torch.Generator().manual_seed(0))
        >>> bool(abs(float(draws.var()) - 1 / 3) < 0.02)
        True

    :param loc: the location :math:`\mu` (the latent :math:`f`).
    :param scale: the lengthscale :math:`\rho > 0`.
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = False

    def __init__(self, loc: Tensor | float, scale: Tensor | float, validate_args: bool | None = None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        super().__init__(self.loc.shape, validate_args=validate_args)

    def expand(self, batch_shape: torch.Size, _instance: MaternThreeHalves | None = None) -> MaternThreeHalves:
        shape = torch.Size(batch_shape)
        return MaternThreeHalves(self.loc.expand(shape), self.scale.expand(shape), validate_args=False)

    @property
    def _a(self) -> Tensor:
        return math.sqrt(3.0) / self.scale

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def variance(self) -> Tensor:
        return (4.0 / 3.0) * self.scale**2 + torch.zeros_like(self.loc)

    def log_prob(self, value: Tensor | float) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        a = self._a
        distance = a * (torch.as_tensor(value, dtype=self.loc.dtype, device=self.loc.device) - self.loc).abs()
        return torch.log(a / 4) + torch.log1p(distance) - distance

    def cdf(self, value: Tensor | float) -> Tensor:
        distance = self._a * (torch.as_tensor(value, dtype=self.loc.dtype, device=self.loc.device) - self.loc)
        tail = (2 + distance.abs()) * torch.exp(-distance.abs()) / 4
        return torch.where(distance >= 0, 1 - tail, tail)

    @torch.no_grad()
    def sample(self, sample_shape: torch.Size = torch.Size(), generator: torch.Generator | None = None) -> Tensor:
        """Exact draws (four uniforms each), reproducible with ``generator`` (or the global torch seed)."""
        shape = self._extended_shape(torch.Size(sample_shape))
        device = draw_device(generator, self.loc.device)
        u = torch.rand((4, *shape), dtype=self.loc.dtype, device=device, generator=generator).to(self.loc.device)
        u = u.clamp_min(torch.finfo(u.dtype).tiny)
        exponential = -torch.log(u[0])
        second = torch.where(u[2] < 0.5, -torch.log(u[1]), torch.zeros_like(u[1]))  # Ga(2) w.p. 1/2
        sign = torch.where(u[3] < 0.5, -1.0, 1.0).to(u.dtype)
        return self.loc.expand(shape) + sign * (exponential + second) / self._a.expand(shape)
