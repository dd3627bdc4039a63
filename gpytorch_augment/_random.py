r"""Bridge from torch's random number generators to NumPy.

Some exact samplers exist only for NumPy (e.g. the ``polyagamma`` package). To keep their draws under the
control of torch's seeding, :func:`numpy_generator` returns a NumPy generator whose state is re-derived from
the torch generator *at every call*:

* one persistent ``np.random.Generator(np.random.PCG64())`` is kept per torch generator (a module-level one for
  torch's default generator, a weak-key dictionary for explicit ``torch.Generator`` objects), so no NumPy
  generator is constructed per call;
* at each call, 128 random bits are drawn from the torch generator (three ``randint(0, 2**62)`` draws) and written
  into the PCG64 state in place, with a fixed odd increment.

Consequences:

* NumPy draws are a deterministic function of the torch RNG state: after ``torch.manual_seed(s)`` (or with a
  ``torch.Generator`` seeded by ``g.manual_seed(s)``) the same sequence of calls reproduces the same draws;
* every call advances the torch generator, so successive calls give different NumPy streams;
* an explicit generator never touches torch's global RNG state.

The returned generator is only valid until the next call for the same torch generator (which re-seeds it):
draw from it immediately. It is not thread-safe; use one torch generator per thread if needed.

:func:`seeded_by` is the companion for code that calls ``sample()`` without a ``generator`` argument: inside
``with seeded_by(g):`` torch's global RNG is temporarily seeded from ``g`` (and restored on exit).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

__all__ = ["draw_device", "numpy_generator", "seeded_by"]

#: Fixed odd PCG64 increment (stream selector). Any odd 128-bit value works; this one is arbitrary.
_PCG64_INC = 0x5851F42D4C957F2D_14057B7EF767814F | 1
_MASK128 = (1 << 128) - 1

_DEFAULT_NP_GENERATOR = np.random.Generator(np.random.PCG64())
_EXPLICIT_NP_GENERATORS: weakref.WeakKeyDictionary[torch.Generator, np.random.Generator] = (
    weakref.WeakKeyDictionary()
)


def _draw_128_bits(generator: torch.Generator | None) -> int:
    """128 uniform random bits taken from ``generator`` (torch's default generator if ``None``)."""
    device = generator.device if generator is not None else torch.device("cpu")
    a, b, c = (int(v) for v in torch.randint(0, 2**62, (3,), generator=generator, device=device).tolist())
    # 62 + 62 + 4 bits, each uniform and independent.
    return (a | (b << 62) | (c << 124)) & _MASK128


def numpy_generator(generator: torch.Generator | None = None) -> np.random.Generator:
    """Return the persistent NumPy generator attached to ``generator``, re-seeded from it in place.

    Args:
        generator: a torch generator; ``None`` (or ``torch.default_generator``) means torch's global RNG, so that
            ``torch.manual_seed`` controls the draws.

    Returns:
        A ``np.random.Generator`` (PCG64) whose state is a deterministic function of 128 bits just drawn from
        ``generator``. Use it right away: the next call for the same torch generator re-seeds the same object.
    """
    if generator is None or generator is torch.default_generator:
        np_gen = _DEFAULT_NP_GENERATOR
        generator = None
    else:
        try:
            np_gen = _EXPLICIT_NP_GENERATORS.get(generator)
            if np_gen is None:
                np_gen = _EXPLICIT_NP_GENERATORS[generator] = np.random.Generator(np.random.PCG64(0))
        except TypeError:  # older torch (2.11): a Generator takes no weak reference; a fresh one, set below
            np_gen = np.random.Generator(np.random.PCG64(0))
    np_gen.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": _draw_128_bits(generator), "inc": _PCG64_INC},
        "has_uint32": 0,
        "uinteger": 0,
    }
    return np_gen


def _cuda_indices(generator: torch.Generator, device: torch.device | str | None) -> list[int]:
    """The CUDA devices whose global RNG a seeded block may use: the generator's, ``device``'s and, once CUDA is
    initialised, the current one (data may live there)."""
    devices = [generator.device] + ([torch.device(device)] if device is not None else [])
    indices = set()
    for d in devices:
        if d.type == "cuda":
            indices.add(d.index if d.index is not None else torch.cuda.current_device())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        indices.add(torch.cuda.current_device())
    return sorted(indices)


@contextmanager
def seeded_by(generator: torch.Generator | None, device: torch.device | str | None = None) -> Iterator[None]:
    """Context manager: route torch's global RNGs through ``generator`` for the duration of the block.

    With ``generator=None`` (or ``torch.default_generator``) nothing changes. Otherwise a seed is drawn from
    ``generator`` (advancing it, on its own device), the global RNG states are saved, re-seeded with it, and
    restored on exit; so draws inside the block (including :func:`numpy_generator` with ``None``) are reproducible
    from ``generator`` and the global streams are left untouched. The global RNGs covered are the CPU one and the
    CUDA one of each device that may be drawn on: the generator's, ``device``'s (pass the data's device) and, once
    CUDA is initialised, the current device. So a CPU ``torch.Generator()`` also seeds draws on CUDA data.

    Example::

        >>> import torch
        >>> from gpytorch_augment._random import seeded_by
        >>> draws = []
        >>> for _ in range(2):
        ...     with seeded_by(torch.Generator().manual_seed(3)):
        ...         draws.append(torch.randn(2))
        >>> torch.equal(*draws)
        True
    """
    if generator is None or generator is torch.default_generator:
        yield
        return
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
    cuda = _cuda_indices(generator, device)
    # only the devices that may be drawn on: torch.manual_seed would also queue (costly) lazy seeding of every GPU
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(seed)
        for index in cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        yield


def draw_device(generator: torch.Generator | None, device: torch.device) -> torch.device:
    """The device a draw with ``generator`` must be made on: the generator's (then moved to ``device``), or
    ``device`` itself when drawing from the global RNG. A CPU generator thus works with CUDA data.

    Example::

        >>> import torch
        >>> from gpytorch_augment._random import draw_device
        >>> draw_device(torch.Generator(), torch.device("cpu"))
        device(type='cpu')
    """
    return device if generator is None else generator.device
