r"""Prior terms of a (sparse) GP in whitened coordinates, and the cache that notices when they change.

With inducing inputs :math:`Z` (a full GP is the case :math:`Z = X`), :math:`K_{ZZ} + \epsilon I = LL^\top` and
:math:`u = \mu_Z + Lv`, every quantity the engines need from the prior at inputs :math:`X` is

.. math::
    L,\qquad A = L^{-1}K_{ZX},\qquad \mu_Z,\qquad \mu_X,\qquad \operatorname{diag}K_{XX},\qquad
    \lVert A_{:,i}\rVert^2 = \operatorname{diag}(K_{XZ}K_{ZZ}^{-1}K_{ZX}).

They are computed once per change of the hyper-parameters: :class:`PriorCache` keeps the last result with a copy
of everything it was computed from and hands it back only while all of it compares equal.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from linear_operator.utils.errors import NanError, NotPSDError
from torch import Tensor

from .linalg import tri_solve

__all__ = [
    "FactorizationError",
    "PriorCache",
    "PriorFactorizationError",
    "PriorTerms",
    "linalg_advice",
    "prior_cholesky",
    "split_prior",
    "whiten_prior",
    "whiten_prior_blocks",
]

#: up to this many extra kernel entries, the prior at ``cat[Z, x]`` is evaluated as one dense block (one kernel call
#: instead of two: cheaper for small batches, where the per-call overhead dominates)
DENSE_PRIOR_ELEMENTS = 2**16


class FactorizationError(NotPSDError, ValueError):
    """A factorisation failed (a matrix not positive definite in floating point, or holding NaN).

    A ``NotPSDError`` (what GPyTorch raises) and a ``ValueError`` (bad settings or data, not a bug), whose message says
    what failed and what to do. The public entry points of the samplers and of their predictions raise it (or its
    subclass :class:`PriorFactorizationError`) in place of linear_operator's ``NotPSDError`` / ``NanError`` and torch's
    ``LinAlgError``.

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import FactorizationError, linalg_advice
        >>> try:
        ...     with linalg_advice("the demo"):
        ...         torch.linalg.cholesky(torch.tensor([[1.0, 2.0], [2.0, 1.0]]))
        ... except FactorizationError as err:
        ...     print(str(err)[:25], isinstance(err, ValueError))
        the demo failed: a matrix True
    """


_F = TypeVar("_F", bound=Callable[..., Any])


@contextmanager
def linalg_advice(what: str) -> Iterator[None]:
    """Re-raise linear_operator's ``NotPSDError`` / ``NanError`` and torch's ``LinAlgError`` from the block as a
    :class:`FactorizationError` saying what failed (``what``) and what to do; package errors pass through unchanged.
    Also usable as a decorator, :func:`with_linalg_advice`."""
    try:
        yield
    except FactorizationError:
        raise
    except NanError as err:
        raise FactorizationError(
            f"{what} failed: a matrix holds NaN. A kernel hyper-parameter, an input or a likelihood constant is NaN "
            f"or infinite (an optimizer step too large?); check them. ({err})"
        ) from err
    except (NotPSDError, torch.linalg.LinAlgError) as err:
        raise FactorizationError(
            f"{what} failed: a matrix is not positive definite in floating point, even with GPyTorch's jitter. The "
            f"samplers factorise in their linalg_dtype (float64 unless lowered: use float64 then); otherwise raise "
            f"the jitter (jitter=), rescale the kernel (a large outputscale, a long lengthscale, nearly duplicate "
            f"inputs), or check the data and hyper-parameters for extreme values. ({err})"
        ) from err


def with_linalg_advice(what: str) -> Callable[[_F], _F]:
    """Decorator form of :func:`linalg_advice`."""

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with linalg_advice(what):
                return fn(*args, **kwargs)

        return wrapped  # type: ignore[return-value]

    return decorate


class PriorFactorizationError(FactorizationError):
    """The prior covariance could not be factorised (not positive definite in floating point, even with jitter).

    A ``NotPSDError`` (what GPyTorch raises) and a ``ValueError`` (bad settings, not a bug), whose message says which
    matrix failed and what to do.

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import PriorFactorizationError, prior_cholesky
        >>> try:
        ...     prior_cholesky(torch.tensor([[1.0, 2.0], [2.0, 1.0]]), "K")
        ... except PriorFactorizationError as err:
        ...     print(str(err)[:23], "float64" in str(err), "jitter" in str(err))
        the prior covariance K, True True
    """


def prior_cholesky(K: Tensor, what: str = "K_ZZ + jitter I", source_dtype: torch.dtype | None = None) -> Tensor:
    """``psd_safe_cholesky(K)`` (GPyTorch's jitter retries), raising :class:`PriorFactorizationError` with advice
    when the factorisation fails (``source_dtype``: the dtype the kernel was evaluated in, if not ``K``'s).

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import prior_cholesky
        >>> prior_cholesky(torch.eye(2, dtype=torch.float64))
        tensor([[1., 0.],
                [0., 1.]], dtype=torch.float64)
    """
    try:
        return psd_safe_cholesky(K)
    except NanError as err:
        raise PriorFactorizationError(
            f"the prior covariance {what} has NaN entries: a kernel hyper-parameter or the inducing inputs became NaN "
            f"(an optimizer step too large? lower its learning rate), or the inputs hold NaN. ({err})"
        ) from err
    except NotPSDError as err:
        scale = float(K.detach().diagonal(dim1=-2, dim2=-1).abs().max()) if K.numel() else 0.0
        where = f"{K.dtype}" if source_dtype in (None, K.dtype) else f"{source_dtype} (factorised in {K.dtype})"
        raise PriorFactorizationError(
            f"the prior covariance {what}, evaluated in {where}, is not positive definite (largest diagonal entry "
            f"{scale:.3g}), even with GPyTorch's jitter: its kernel matrix is too ill-conditioned (a large "
            f"outputscale, nearly duplicate inputs, a long lengthscale). Work in float64 (model.double() and "
            f"float64 data), raise the jitter (the strategy's jitter_val / the sampler's jitter=), or rescale the "
            f"kernel. ({err})"
        ) from err


class PriorTerms(NamedTuple):
    """Prior quantities at a set of inputs, in the linear-algebra dtype (``(*b)`` = batch or latent dimensions).

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import split_prior, whiten_prior
        >>> mean, K = torch.zeros(5, dtype=torch.float64), torch.eye(5, dtype=torch.float64)
        >>> terms = whiten_prior(*split_prior(mean, K, num_inducing=2, dense=True), 1e-6, torch.float64)
        >>> terms.L.shape, terms.A.shape, terms.k_diag.shape
        (torch.Size([2, 2]), torch.Size([2, 3]), torch.Size([3]))
    """

    L: Tensor  #: :math:`\mathrm{chol}(K_{ZZ} + \epsilon I)`, ``(*b, M, M)``
    A: Tensor  #: :math:`L^{-1}K_{ZX}`, ``(*b, M, N)``
    mu_Z: Tensor  #: prior mean at the inducing inputs, ``(*b, M)``
    mu_X: Tensor  #: prior mean at the data, ``(*b, N)``
    k_diag: Tensor  #: :math:`\operatorname{diag}K_{XX}` (plus the data jitter, if any), ``(*b, N)``
    a_sq: Tensor  #: squared column norms :math:`\lVert A_i\rVert^2 = \operatorname{diag}Q_{XX}`, ``(*b, N)``

    def detach(self) -> PriorTerms:
        return PriorTerms(*(t.detach() for t in self))

    def take(self, idx: Tensor | slice) -> PriorTerms:
        """The terms of the data points ``idx`` (the inducing-point terms are shared)."""
        return PriorTerms(
            L=self.L,
            A=self.A[..., idx],
            mu_Z=self.mu_Z,
            mu_X=self.mu_X[..., idx],
            k_diag=self.k_diag[..., idx],
            a_sq=self.a_sq[..., idx],
        )


def split_prior(
    mean: Tensor, covar: Any, num_inducing: int, dense: bool | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(mean, K_ZZ, K_ZX, diag K_XX)`` of the prior ``(mean, covar)`` at ``cat[Z, x]`` (``covar`` a linear
    operator). The kernel is evaluated once for the rows of ``Z`` plus the diagonal at ``x``, or as one dense block
    (``dense``; default: when the extra entries are few, up to :data:`DENSE_PRIOR_ELEMENTS`).

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import split_prior
        >>> mean, K_ZZ, K_ZX, k_diag = split_prior(torch.zeros(5), torch.eye(5), num_inducing=2, dense=True)
        >>> K_ZZ.shape, K_ZX.shape, k_diag.shape
        (torch.Size([2, 2]), torch.Size([2, 3]), torch.Size([3]))
    """
    M = num_inducing
    N = mean.shape[-1] - M
    if dense is None:
        dense = N * (M + N) <= DENSE_PRIOR_ELEMENTS
    if dense:
        full = covar.to_dense()
        rows, k_diag = full[..., :M, :], full[..., M:, M:].diagonal(dim1=-1, dim2=-2)
    else:
        rows, k_diag = covar[..., :M, :].to_dense(), covar[..., M:, M:].diagonal(dim1=-1, dim2=-2)
    return mean, rows[..., :M], rows[..., M:], k_diag


def whiten_prior(
    mean: Tensor,
    K_ZZ: Tensor,
    K_ZX: Tensor,
    k_diag: Tensor,
    jitter: float,
    dtype: torch.dtype,
    data_jitter: bool = False,
) -> PriorTerms:
    r"""Whiten the prior blocks (``mean`` at ``cat[Z, x]``): :math:`L = \mathrm{chol}(K_{ZZ} + \epsilon I)` and
    :math:`A = L^{-1}K_{ZX}`, everything cast to ``dtype`` first. ``data_jitter`` adds :math:`\epsilon` to
    :math:`\operatorname{diag}K_{XX}` as well (GPyTorch's whitened strategy does).

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import whiten_prior
        >>> K_ZZ = torch.tensor([[4.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
        >>> terms = whiten_prior(torch.zeros(3), K_ZZ, torch.ones(2, 1), torch.ones(1), 0.0, torch.float64)
        >>> terms.L.diagonal().tolist(), terms.A.squeeze(-1).tolist()
        ([2.0, 1.0], [0.5, 1.0])
    """
    return whiten_prior_blocks([(mean, K_ZZ, K_ZX, k_diag)], jitter, dtype, data_jitter)


def whiten_prior_blocks(
    blocks: Iterable[tuple[Tensor, Tensor, Tensor, Tensor]],
    jitter: float,
    dtype: torch.dtype,
    data_jitter: bool = False,
) -> PriorTerms:
    r""":func:`whiten_prior` of the data points in blocks: ``blocks`` yields :func:`split_prior`'s
    ``(mean, K_ZZ, K_ZX, k_diag)`` at ``cat[Z, x_b]`` for consecutive blocks :math:`x_b` of the inputs (its first
    :math:`K_{ZZ}` and :math:`\mu_Z` are used); each block is whitened as it comes, so a generator that evaluates the
    kernel block by block never holds more than one block's kernel matrix besides :math:`A`. The terms are those of
    the whole inputs (equal to :func:`whiten_prior`'s up to rounding).

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import whiten_prior, whiten_prior_blocks
        >>> K_ZZ, K_ZX = torch.tensor([[4.0, 0.0], [0.0, 1.0]]), torch.tensor([[2.0, 4.0], [1.0, 3.0]])
        >>> whole = whiten_prior(torch.zeros(4), K_ZZ, K_ZX, torch.ones(2), 0.0, torch.float64)
        >>> parts = whiten_prior_blocks([(torch.zeros(3), K_ZZ, K_ZX[:, i:i + 1], torch.ones(1)) for i in (0, 1)],
        ...                             0.0, torch.float64)
        >>> torch.equal(whole.A, parts.A), parts.A.tolist()
        (True, [[1.0, 2.0], [1.0, 3.0]])
    """
    L = mu_Z = source_dtype = None
    pieces: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []  # (mu_X, k_diag, A, a_sq) per block
    for mean, K_ZZ, K_ZX, k_diag in blocks:
        M = K_ZZ.shape[-1]
        if L is None:
            source_dtype = K_ZZ.dtype
            K_ZZ = K_ZZ.to(dtype)
            eye = torch.eye(M, dtype=dtype, device=K_ZZ.device)
            L, mu_Z = prior_cholesky(K_ZZ + jitter * eye, source_dtype=source_dtype), mean[..., :M].to(dtype)
        A = tri_solve(L, K_ZX.to(dtype))
        k_diag = k_diag.to(dtype)
        pieces.append((mean[..., M:].to(dtype), k_diag + jitter if data_jitter else k_diag, A, A.pow(2).sum(-2)))
    if L is None:
        raise ValueError("whiten_prior_blocks needs at least one block")
    mu_X, k_diag, A, a_sq = (parts[0] if len(parts) == 1 else torch.cat(parts, -1) for parts in zip(*pieces))
    return PriorTerms(L=L, A=A, mu_Z=mu_Z, mu_X=mu_X, k_diag=k_diag, a_sq=a_sq)


def _all_same(pairs: Sequence[tuple[Tensor, Tensor]]) -> bool:
    """Whether every pair has equal shape, dtype, device and values (NaN never equals), reading the comparison back
    from each device once (one host synchronisation per device, not one per pair)."""
    if any(a.shape != b.shape or a.dtype != b.dtype or a.device != b.device for a, b in pairs):
        return False
    per_device: dict[torch.device, list[Tensor]] = {}
    for a, b in pairs:
        per_device.setdefault(a.device, []).append((a == b).all())
    return all(bool(torch.stack(flags).all()) for flags in per_device.values())


class _Entry(NamedTuple):
    inputs: list[Tensor]  # copies of the inputs' values
    tensors: list[Tensor]  # the model's tensors (references)
    values: list[Tensor]  # copies of their values
    flags: tuple[Any, ...]
    value: tuple[Tensor | None, ...]
    versions: tuple[int, ...]  # of the cached tensors (an in-place write into them invalidates the entry)


class PriorCache:
    """One cached tuple of tensors computed from some inputs, some model tensors and some non-tensor flags.

    :meth:`get` returns it only while the inputs keep their values, the model tensors are the same objects with the
    same values, the flags compare equal and nobody wrote into the cached tensors; anything else is a miss. This is
    the one mechanism by which both engines notice a change of hyper-parameters (an optimizer step,
    ``load_state_dict``, moved inducing points, ``train()``/``eval()``, ...). Not pickled: a copy starts empty.

    Example::

        >>> import torch
        >>> from gpytorch_augment.core import PriorCache
        >>> cache, x, w = PriorCache(), torch.zeros(3), torch.ones(2)
        >>> cache.put([x], [w], (), (x + 1,))
        >>> cache.get([x], [w], ())
        (tensor([1., 1., 1.]),)
        >>> w.add_(1.0)             # a parameter changed in place: the entry is stale
        tensor([2., 2.])
        >>> cache.get([x], [w], ()) is None
        True
    """

    def __init__(self) -> None:
        self._entry: _Entry | None = None

    def clear(self) -> None:
        self._entry = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_entry": None}

    def __deepcopy__(self, memo: dict[int, Any]) -> PriorCache:
        return PriorCache()

    def get(
        self, inputs: Sequence[Tensor], tensors: Sequence[Tensor], flags: tuple[Any, ...] = ()
    ) -> tuple[Tensor | None, ...] | None:
        entry = self._entry
        if (
            entry is None
            or entry.flags != flags
            or len(entry.tensors) != len(tensors)
            or len(entry.inputs) != len(inputs)
            or any(a is not b for a, b in zip(entry.tensors, tensors))
            or entry.versions != _versions(entry.value)
            or not _all_same([*zip(entry.inputs, inputs), *zip(entry.values, tensors)])
        ):
            return None
        return entry.value

    def valid(self, inputs: Sequence[Tensor], tensors: Sequence[Tensor], flags: tuple[Any, ...] = ()) -> bool:
        """Whether :meth:`get` would hit."""
        return self.get(inputs, tensors, flags) is not None

    @torch.no_grad()
    def put(
        self,
        inputs: Sequence[Tensor],
        tensors: Sequence[Tensor],
        flags: tuple[Any, ...],
        value: tuple[Tensor | None, ...],
    ) -> None:
        self._entry = _Entry(
            inputs=[t.detach().clone() for t in inputs],
            tensors=list(tensors),
            values=[t.detach().clone() for t in tensors],
            flags=flags,
            value=tuple(value),
            versions=_versions(value),
        )


def _versions(value: tuple[Tensor | None, ...]) -> tuple[int, ...]:
    return tuple(t._version for t in value if t is not None)
