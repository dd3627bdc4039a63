r"""The convergence summary of a run's draws: :class:`PosteriorSummary` (what
:meth:`PosteriorSamples.summary <gpytorch_augment.inference.mcmc.PosteriorSamples.summary>` returns)."""

from __future__ import annotations

import math
from typing import NamedTuple

from torch import Tensor

__all__ = ["SUMMARY_ROWS", "PosteriorSummary"]


class PosteriorSummary(NamedTuple):
    """Per-coordinate posterior summary and convergence diagnostics (Vehtari et al., 2021).

    Example::

        >>> import gpytorch, torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior
        >>> x = torch.linspace(-2, 2, 8, dtype=torch.float64).unsqueeze(-1)
        >>> prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
        >>> sampler = GibbsSampler(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double())
        >>> samples = sampler.sample(20, warmup=10, num_chains=2, seed=0, progress=False)
        >>> summary = samples.summary()
        >>> summary.mean.shape, summary.rhat.shape
        (torch.Size([8]), torch.Size([8]))
        >>> repr(summary).splitlines()[0].split()
        ['mean', 'sd', 'q05', 'q95', 'ess_bulk', 'ess_tail', 'ess_sd', 'rhat']

    Printed, it is a table with one row per coordinate, as ArviZ's ``summary``, whose column headers are the
    attribute names (``summary.q05`` is the column ``q05``); above :data:`SUMMARY_ROWS` rows the rest is counted,
    not printed. Choose a sampler on the worst of ``ess_bulk``, ``ess_tail`` and ``ess_sd``.
    """

    mean: Tensor
    sd: Tensor
    rhat: Tensor  #: rank-normalised split-:math:`\hat R` (max of bulk and folded/tail)
    ess_bulk: Tensor  #: bulk effective sample size (rank-normalised split chains)
    q05: Tensor | None = None  #: 5 % quantile over all draws
    q95: Tensor | None = None  #: 95 % quantile over all draws
    name: str = "f"  #: the variable summarised (the row labels)
    #: coordinates whose draws are all equal (e.g. an auxiliary variable fixed at 0 where its factor is absent):
    #: their R-hat and ESS are undefined (NaN), and the printed table marks them with ``*`` and a note
    constant: Tensor | None = None
    ess_tail: Tensor | None = None  #: tail effective sample size (5 % and 95 % quantile indicators)
    ess_sd: Tensor | None = None  #: effective sample size of the posterior sd

    def __repr__(self) -> str:
        columns = {"mean": self.mean, "sd": self.sd, "q05": self.q05, "q95": self.q95, "ess_bulk": self.ess_bulk,
                   "ess_tail": self.ess_tail, "ess_sd": self.ess_sd, "rhat": self.rhat}  # fmt: skip
        columns = {k: v.detach().reshape(-1).tolist() for k, v in columns.items() if v is not None}
        shape = tuple(self.mean.shape)
        total = self.mean.numel()
        shown = total if total <= SUMMARY_ROWS else SUMMARY_ROWS
        labels = [_row_label(self.name, shape, k) for k in range(shown)]
        constant = [] if self.constant is None else self.constant.reshape(-1).tolist()
        if any(constant):
            labels = [label + (" *" if constant[k] else "") for k, label in enumerate(labels)]
        cells = {k: [_format_cell(k, v) for v in values[:shown]] for k, values in columns.items()}
        label_width = max([len(label) for label in labels] + [0])
        widths = {k: max([len(k)] + [len(c) for c in cells[k]]) for k in cells}
        lines = [" " * label_width + "".join("  " + k.rjust(widths[k]) for k in cells)]
        for row, label in enumerate(labels):
            lines.append(label.ljust(label_width) + "".join("  " + cells[k][row].rjust(widths[k]) for k in cells))
        if shown < total:
            lines.append(f"... {total - shown} more rows")
        if any(constant):
            lines.append(
                f"* constant over every draw ({sum(constant)} of {total}; e.g. an auxiliary variable fixed at 0 where "
                "its factor is absent): r_hat and ess_bulk are undefined (nan)"
            )
        return "\n".join(lines)

    __str__ = __repr__


#: the rows a printed :class:`PosteriorSummary` shows before it counts the rest
SUMMARY_ROWS = 20


def _row_label(name: str, shape: tuple[int, ...], k: int) -> str:
    if not shape:
        return name
    index = []
    for size in reversed(shape):
        index.append(k % size)
        k //= size
    return f"{name}[{', '.join(str(i) for i in reversed(index))}]"


def _format_cell(column: str, value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if column.startswith("ess_"):
        return f"{value:.0f}"
    if column == "rhat":
        return f"{value:.2f}"
    return f"{value:.3f}" if abs(value) < 1e4 else f"{value:.3e}"
