"""Names kept for one release after the sampler refactor (0.3; removed in 0.4): each still resolves, with a
``DeprecationWarning`` naming its replacement. Modules that exported a name re-export it through
:func:`deprecated_attribute`."""

from __future__ import annotations

import warnings
from typing import Any

from .gibbs.kernel import GibbsKernel
from .mcmc import ChainState, PosteriorPrediction, PosteriorSamples, PosteriorSummary

#: old name -> (new name, object)
RENAMED: dict[str, tuple[str, Any]] = {
    "GibbsSamples": ("PosteriorSamples", PosteriorSamples),
    "GibbsState": ("ChainState", ChainState),
    "GibbsPrediction": ("PosteriorPrediction", PosteriorPrediction),
    "GibbsSummary": ("PosteriorSummary", PosteriorSummary),
    "BlockedGibbsKernel": ("GibbsKernel", GibbsKernel),
}


def deprecated_attribute(module: str, name: str) -> Any:
    """The object an old ``name`` stands for, with a ``DeprecationWarning``; ``AttributeError`` for any other name
    (the body of a module's ``__getattr__``)."""
    if name not in RENAMED:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new, obj = RENAMED[name]
    warnings.warn(
        f"{module}.{name} is deprecated and will be removed in the next release: use "
        f"{obj.__module__.rsplit('.', 1)[0]}.{new}",
        DeprecationWarning,
        stacklevel=3,
    )
    return obj
