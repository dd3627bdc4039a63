r"""Mixing laws :math:`p(\omega)` of :class:`~gpytorch_augment.likelihoods.LaplaceTransformLikelihood`: a law on
:math:`\omega > 0` given by its Laplace transform :math:`\varphi(r) = \int e^{-r\omega}p(\omega)\,d\omega`.

A law states :math:`\log\varphi` (normalised, :math:`\varphi(0) = 1`; an unnormalised transform's
:math:`\log\varphi(0)` is its :meth:`~MixingLaw.log_mass`) and, through the defaults here, everything the
likelihood needs from it: the mean :math:`-(\log\varphi)'(r)` of the tilted law
:math:`p_r(\omega)\propto e^{-r\omega}p(\omega)` by autograd, its law and its draws by numerical inversion of the
transform (:class:`~gpytorch_augment.distributions.TiltedLaplaceTransform`). The known families below replace
those defaults by closed forms and exact samplers (the lookup table of :doc:`/guide/writing_a_likelihood`):

* :class:`PolyaGammaMixing`, :math:`\mathrm{PG}(b, 0)`: :math:`\varphi(r) = \cosh^{-b}\sqrt{r/2}`, tilted law
  :math:`\mathrm{PG}(b, \sqrt{2r})`;
* :class:`GammaMixing`, :math:`\mathrm{Ga}(a, b)`: :math:`\varphi(r) = (1 + r/b)^{-a}`, tilted law
  :math:`\mathrm{Ga}(a, b + r)`;
* :class:`InverseGammaMixing`, :math:`\mathrm{InvGamma}(\tfrac12, b)`: :math:`\varphi(r) = e^{-2\sqrt{br}}`,
  tilted law the inverse Gaussian :math:`\mathrm{IG}(\sqrt{b/r}, 2b)`;
* :class:`InverseGammaMixing`, :math:`\mathrm{InvGamma}(\tfrac32, b)`: :math:`\varphi(r) = (1 + z)e^{-z}`,
  :math:`z = 2\sqrt{br}`, tilted law :math:`\mathrm{GIG}(-\tfrac32, 2r, 2b)`
  (:class:`~gpytorch_augment.distributions.TiltedInverseGamma`, drawn exactly from inverse-Gaussian and Gamma
  variates).

:class:`LaplaceTransformMixing` is any other law, given by its :math:`\log\varphi` as a torch function.
"""

from __future__ import annotations

from collections.abc import Callable

import gpytorch
import torch
from torch import Tensor
from torch.distributions import Distribution, Gamma

from .._numerics import LOG2, log_cosh, log_cosh_sqrt, pg_mean_from_square
from .._random import draw_device
from ..distributions.inverse_gaussian import InverseGamma, InverseGaussian
from ..distributions.laplace_transform import TiltedLaplaceTransform, check_laplace_transform
from ..distributions.polya_gamma import PolyaGamma
from ..distributions.tilted_inverse_gamma import TiltedInverseGamma
from ._constants import PositiveConstant, register_positive_constant

__all__ = ["GammaMixing", "InverseGammaMixing", "LaplaceTransformMixing", "MixingLaw", "PolyaGammaMixing"]


class MixingLaw(gpytorch.Module):
    r"""A law :math:`p(\omega)` on :math:`\omega > 0` given by its Laplace transform (see the module docstring).

    Subclasses implement :meth:`log_laplace` (real and complex arguments) and may override :meth:`tilted_mean`,
    :meth:`tilted` and :meth:`sample_tilted` with closed forms and exact samplers; constants are GPyTorch
    parameters (learnable where ``requires_grad``).

    Example::

        >>> import torch
        >>> from gpytorch_augment.likelihoods import GammaMixing
        >>> law = GammaMixing(concentration=2.0, rate=1.0)
        >>> r = torch.tensor([0.0, 1.0])
        >>> with torch.no_grad():
        ...     law.log_laplace(r), law.tilted_mean(r)               # -2 log(1 + r), 2 / (1 + r)
        (tensor([-0.0000, -1.3863]), tensor([2., 1.]))
    """

    def log_laplace(self, r: Tensor) -> Tensor:
        r""":math:`\log\varphi(r)`, normalised to :math:`\varphi(0) = 1`, elementwise, for real :math:`r\ge0` and
        complex :math:`r` with positive real part (the analytic continuation)."""
        raise NotImplementedError

    def log_mass(self) -> Tensor | float:
        r""":math:`\log\varphi(0)` of the transform the law was given by (0 for the families)."""
        return 0.0

    def tilted_mean(self, r: Tensor) -> Tensor:
        r""":math:`E_{p_r}\omega = -(\log\varphi)'(r)`; by autograd, differentiable in :math:`r` and the constants
        while gradients are enabled."""
        return self.log_laplace_and_mean(r)[1]

    def log_laplace_and_mean(self, r: Tensor) -> tuple[Tensor, Tensor]:
        r""":math:`(\log\varphi(r), -(\log\varphi)'(r))` from one evaluation (autograd, with a graph for
        gradients while they are enabled)."""
        graph = torch.is_grad_enabled()
        with torch.enable_grad():
            leaf = r if r.requires_grad else r.detach().requires_grad_(True)
            value = self.log_laplace(leaf)
            if value.requires_grad:
                (slope,) = torch.autograd.grad(value.sum(), leaf, create_graph=graph)
            else:  # log phi constant in r (no graph to r): the law is a point mass at omega = 0
                slope = torch.zeros_like(leaf)
        if not graph:
            value, slope = value.detach(), slope.detach()
        return value, -slope

    def tilted(self, r: Tensor) -> Distribution:
        r"""The law of :math:`p_r(\omega) \propto e^{-r\omega}p(\omega)` (:math:`r = 0`: the prior)."""
        return TiltedLaplaceTransform(self.log_laplace, r.detach(), validate_args=False)

    def prior(self, like: Tensor) -> Distribution:
        r"""The law :math:`p(\omega)` itself, one per element of ``like`` (the tilted law at :math:`r = 0`)."""
        return self.tilted(torch.zeros_like(like))

    def sample_tilted(self, r: Tensor, generator: torch.Generator | None = None) -> Tensor:
        r"""One draw of :math:`\omega \sim p_r` per element of ``r`` (no gradient)."""
        with torch.no_grad():
            return self.tilted(r).sample(generator=generator)


class LaplaceTransformMixing(MixingLaw):
    r"""Any mixing law, given by :math:`\log\varphi` as a torch function of :math:`r\ge0`:
    :math:`\varphi(r) = \int_0^\infty e^{-r\omega}p(\omega)\,d\omega`.

    :math:`\varphi` need not be normalised: :meth:`log_laplace` subtracts :math:`\log\varphi(0)` and
    :meth:`log_mass` returns it (the likelihood adds it to :math:`\log C`). Checked at construction
    (:func:`~gpytorch_augment.distributions.laplace_transform.check_laplace_transform`): finite, non-increasing and
    convex on a grid. Gibbs draws invert the transform numerically and need ``log_phi`` to accept complex tensors
    (write it with ``exp``, ``log``, ``log1p``, ``sqrt``, powers; not ``abs``, ``clamp``, ``softplus`` or
    ``lgamma`` of ``r``). A ``log_phi`` that is a ``torch.nn.Module`` is registered, so its parameters are learnt
    with the likelihood's.

    Example::

        >>> import torch
        >>> from gpytorch_augment.likelihoods import LaplaceTransformMixing
        >>> law = LaplaceTransformMixing(lambda r: -torch.sqrt(2 * r))      # Lévy: InvGamma(1/2, 1/2)
        >>> law.tilted_mean(torch.tensor([0.5, 2.0])).detach()               # 1 / sqrt(2 r), by autograd
        tensor([1.0000, 0.5000])
        >>> LaplaceTransformMixing(lambda r: r)
        Traceback (most recent call last):
        ...
        ValueError: log_phi is not non-increasing: log phi rises from 0 at r = 0 to 1e-06 at r = 1e-06 ...

    :param log_phi: :math:`r \mapsto \log\varphi(r)`, elementwise.
    :raises ValueError: naming ``log_phi`` if it fails the checks.
    """

    def __init__(self, log_phi: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        if not callable(log_phi):
            raise ValueError(f"log_phi must be a callable r -> log phi(r); got {type(log_phi).__name__}")
        check_laplace_transform(log_phi, "log_phi")
        self.log_phi = log_phi

    def log_mass(self) -> Tensor:
        return self.log_phi(torch.zeros((), dtype=self._dtype()))

    def _dtype(self) -> torch.dtype:
        return next((p.dtype for p in self.parameters()), torch.get_default_dtype())

    def log_laplace(self, r: Tensor) -> Tensor:
        zero = torch.zeros((), dtype=r.real.dtype, device=r.device)
        return self.log_phi(r) - self.log_phi(zero)

    def sample_tilted(self, r: Tensor, generator: torch.Generator | None = None) -> Tensor:
        try:
            return super().sample_tilted(r, generator)
        except (RuntimeError, TypeError) as error:
            raise ValueError(
                "log_phi failed on complex arguments, which the numerical inversion behind Gibbs draws needs: write "
                f"it with torch functions that accept complex tensors (exp, log, log1p, sqrt, powers) ({error})"
            ) from error


def _complex_log_cosh(z: Tensor) -> Tensor:
    r""":math:`\log\cosh z = z + \log(1 + e^{-2z}) - \log 2`, for real or complex :math:`z` with
    :math:`\operatorname{Re} z \ge 0` (the analytic branch there). Where :math:`\operatorname{Re} z > 18` the
    term :math:`\log(1 + e^{-2z})` (below :math:`e^{-36}`, under the rounding of :math:`z`) is dropped: torch's
    complex ``log1p`` of a subnormal argument (:math:`\operatorname{Re} z \gtrsim 354`) is NaN."""
    if not z.is_complex():
        return log_cosh(z)
    e = torch.exp(-2 * z)
    return z + torch.log1p(torch.where(z.real > 18, torch.zeros_like(e), e)) - LOG2


class PolyaGammaMixing(MixingLaw):
    r""":math:`\omega\sim\mathrm{PG}(b, 0)`: :math:`\varphi(r) = \cosh^{-b}\sqrt{r/2}`; tilted law
    :math:`\mathrm{PG}(b, \sqrt{2r})`, drawn exactly; mean :math:`\frac{b}{2c}\tanh\frac c2`, :math:`c=\sqrt{2r}`.

    Example::

        >>> import torch
        >>> from gpytorch_augment.likelihoods import PolyaGammaMixing
        >>> PolyaGammaMixing().tilted_mean(torch.tensor([0.5]))      # tanh(1/2) / 2
        tensor([0.2311])

    :param b: :math:`b > 0`; a fixed constant unless ``learn_b``.
    """

    def __init__(self, b: float | Tensor = 1.0, learn_b: bool = False) -> None:
        super().__init__()
        register_positive_constant(self, "b", b, requires_grad=learn_b)

    b = PositiveConstant(r"The shape :math:`b` of :math:`\mathrm{PG}(b, 0)`.")

    def log_laplace(self, r: Tensor) -> Tensor:
        r""":math:`-b\log\cosh\sqrt{r/2}`, with a finite gradient at :math:`r = 0` for real ``r``."""
        if r.is_complex():
            return -self.b * _complex_log_cosh(torch.sqrt(r / 2))
        return -self.b * log_cosh_sqrt(r / 2)

    def tilted_mean(self, r: Tensor) -> Tensor:
        r""":math:`\mathrm{PGm}(b, \sqrt{2r})`, with a finite gradient at :math:`r = 0`."""
        return pg_mean_from_square(self.b, 2 * r)

    def log_laplace_and_mean(self, r: Tensor) -> tuple[Tensor, Tensor]:
        return self.log_laplace(r), self.tilted_mean(r)

    def tilted(self, r: Tensor) -> Distribution:
        c = torch.sqrt(2 * r.detach())
        return PolyaGamma(self.b.detach().to(c.dtype).expand_as(c), c, validate_args=False)


class GammaMixing(MixingLaw):
    r""":math:`\omega\sim\mathrm{Ga}(a, b)` (shape, rate): :math:`\varphi(r) = (1 + r/b)^{-a}`; tilted law
    :math:`\mathrm{Ga}(a, b + r)`, drawn exactly; mean :math:`a/(b + r)`.

    Example::

        >>> import torch
        >>> from gpytorch_augment.likelihoods import GammaMixing
        >>> GammaMixing(2.0, 3.0).tilted(torch.tensor([1.0])).mean
        tensor([0.5000])

    :param concentration: :math:`a > 0`; fixed unless ``learn_concentration``.
    :param rate: :math:`b > 0`; fixed unless ``learn_rate``.
    """

    def __init__(
        self,
        concentration: float | Tensor = 1.0,
        rate: float | Tensor = 1.0,
        learn_concentration: bool = False,
        learn_rate: bool = False,
    ) -> None:
        super().__init__()
        register_positive_constant(self, "concentration", concentration, requires_grad=learn_concentration)
        register_positive_constant(self, "rate", rate, requires_grad=learn_rate)

    concentration = PositiveConstant(r"The shape :math:`a`.")
    rate = PositiveConstant(r"The rate :math:`b`.")

    def log_laplace(self, r: Tensor) -> Tensor:
        return -self.concentration * torch.log1p(r / self.rate)

    def tilted_mean(self, r: Tensor) -> Tensor:
        return self.concentration / (self.rate + r)

    def log_laplace_and_mean(self, r: Tensor) -> tuple[Tensor, Tensor]:
        return self.log_laplace(r), self.tilted_mean(r)

    def tilted(self, r: Tensor) -> Distribution:
        rate = self.rate.detach().to(r.dtype) + r.detach()
        return Gamma(self.concentration.detach().to(r.dtype).expand_as(rate), rate, validate_args=False)

    def sample_tilted(self, r: Tensor, generator: torch.Generator | None = None) -> Tensor:
        r"""A standard-gamma draw from ``generator`` divided by the rate :math:`b + r`."""
        with torch.no_grad():
            rate = self.rate.detach().to(r.dtype) + r.detach()
            a = self.concentration.detach().to(r.dtype).expand_as(rate).contiguous()
            draw = torch._standard_gamma(a.to(draw_device(generator, rate.device)), generator=generator)
            omega = draw.to(rate.device) / rate
            return omega.clamp_(min=torch.finfo(omega.dtype).tiny)


class InverseGammaMixing(MixingLaw):
    r""":math:`\omega\sim\mathrm{InvGamma}(\nu, b)` (shape, rate), :math:`\nu \in \{\tfrac12, \tfrac32\}`:

    * :math:`\nu = \tfrac12` (the Lévy law): :math:`\varphi(r) = e^{-2\sqrt{br}}`; tilted law the inverse Gaussian
      :math:`\mathrm{IG}(\sqrt{b/r}, 2b)` (mean, shape), drawn exactly; behind :math:`e^{-|x|}` (Laplace, hinge).
    * :math:`\nu = \tfrac32`: :math:`\varphi(r) = (1 + z)e^{-z}`, :math:`z = 2\sqrt{br}`; mean :math:`2b/(1 + z)`;
      tilted law :math:`\mathrm{GIG}(-\tfrac32, 2r, 2b)`, drawn exactly
      (:class:`~gpytorch_augment.distributions.TiltedInverseGamma`); behind the Matérn-3/2 shape
      :math:`(1 + a|x|)e^{-a|x|}`.

    Both follow from :math:`\int_0^\infty \omega^{-\nu-1}e^{-b/\omega - r\omega}d\omega
    = 2(r/b)^{\nu/2}K_\nu(2\sqrt{br})` and the closed forms of :math:`K_{1/2}, K_{3/2}`.

    Example::

        >>> import torch
        >>> from gpytorch_augment.likelihoods import InverseGammaMixing
        >>> law = InverseGammaMixing(0.5, rate=0.25)
        >>> with torch.no_grad():
        ...     law.log_laplace(torch.tensor([4.0])), law.tilted_mean(torch.tensor([4.0]))   # -2, 1/4
        (tensor([-2.]), tensor([0.2500]))

    :param concentration: :math:`\nu`, 0.5 or 1.5.
    :param rate: :math:`b > 0`; fixed unless ``learn_rate``.
    """

    def __init__(self, concentration: float = 0.5, rate: float | Tensor = 1.0, learn_rate: bool = False) -> None:
        super().__init__()
        if concentration not in (0.5, 1.5):
            raise ValueError(f"concentration must be 0.5 or 1.5 (closed-form Bessel K); got {concentration!r}")
        self.concentration = float(concentration)
        register_positive_constant(self, "rate", rate, requires_grad=learn_rate)

    rate = PositiveConstant(r"The rate :math:`b`.")

    def log_laplace(self, r: Tensor) -> Tensor:
        z = 2 * torch.sqrt(self.rate * r)
        return -z if self.concentration == 0.5 else torch.log1p(z) - z

    def tilted_mean(self, r: Tensor) -> Tensor:
        if self.concentration == 0.5:
            return torch.sqrt(self.rate / r)
        return 2 * self.rate / (1 + 2 * torch.sqrt(self.rate * r))

    def log_laplace_and_mean(self, r: Tensor) -> tuple[Tensor, Tensor]:
        return self.log_laplace(r), self.tilted_mean(r)

    def prior(self, like: Tensor) -> Distribution:
        """The untilted law :math:`\\mathrm{InvGamma}(\\nu, b)`, with its exact density."""
        rate = self.rate.detach().to(like.dtype).expand_as(like)
        return InverseGamma(torch.full_like(rate, self.concentration), rate, validate_args=False)

    def tilted(self, r: Tensor) -> Distribution:
        if self.concentration == 1.5:
            rate = self.rate.detach().to(r.dtype)
            return TiltedInverseGamma(1.5, rate.expand_as(r), r.detach(), validate_args=False)
        rate = self.rate.detach().to(r.dtype)
        mean = torch.sqrt(rate / r.detach())  # inf at r = 0: the Lévy law itself, handled by InverseGaussian
        return InverseGaussian(mean, (2 * rate).expand_as(mean), validate_args=False)
