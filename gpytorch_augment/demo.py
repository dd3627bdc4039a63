r"""Demo: a sparse logistic GP classifier fitted by CAVI on the KEEL ``banana`` data.

Run it with::

    python -m gpytorch_augment.demo                 # full run (a few seconds on one CPU core)
    python -m gpytorch_augment.demo --fast          # tiny run (also: GPYTORCH_AUGMENT_FAST=1)
    python -m gpytorch_augment.demo --out plot.png  # where to save the figure

The model is GPyTorch's usual sparse variational GP (SVGP) with a Pólya-Gamma augmented Bernoulli
likelihood,

.. math::
    f \sim \mathcal{GP}(c, k_\theta),\qquad y_i \mid f \sim \mathrm{Bernoulli}(\sigma(f(x_i))),\qquad
    q(u) = \mathcal N(m, S),\ u = f(Z),

with :math:`M = 50` inducing inputs :math:`Z` placed by (seeded) k-means and kept **fixed**. One call fits it:
``CAVI(model, likelihood, num_data=N).fit(x, y, learn_hyperparameters=True)`` learns :math:`q(u)`, the kernel
hyper-parameters :math:`\theta` and the constant mean :math:`c` together: L-BFGS on the hyper-parameters, with
:math:`q(u)` re-solved by closed-form CAVI steps (optimal :math:`q(\omega_i) = \mathrm{PG}(1, c_i)`, then the
optimal :math:`q(u)`) inside every evaluation (the protocols are described in the user guide's CAVI page).

The demo prints a short report (sizes, iterations of the fit, fit time, test error, test NLL, final augmented ELBO)
and saves the predictive probability surface with the training and inducing points.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.models import ApproximateGP
from gpytorch.variational import CholeskyVariationalDistribution
from torch import Tensor

from .datasets import Dataset, load_keel
from .inference import CAVI, CAVITrace
from .likelihoods import BernoulliLogitLikelihood
from .variational import CAVIVariationalStrategy, kmeans_plus_plus

__all__ = ["DemoResult", "SparseGPClassifier", "kmeans_inducing_points", "main", "predict_proba"]

#: environment variable that switches the demo (and the tutorials) to their tiny fast mode
FAST_ENV = "GPYTORCH_AUGMENT_FAST"


class SparseGPClassifier(ApproximateGP):
    r"""A sparse GP for binary classification whose :math:`q(u)` is fitted in closed form by CAVI.

    An SVGP in the usual GPyTorch sense: constant mean, scaled RBF kernel,

    .. math::
        f \sim \mathcal{GP}\big(c,\ s^2 \exp(-\lVert x - x' \rVert^2 / 2\ell^2)\big),\qquad
        q(f) = \int p(f \mid u)\, q(u)\, du,\qquad u = f(Z),

    with a whitened :class:`~gpytorch_augment.CAVIVariationalStrategy` holding a
    ``CholeskyVariationalDistribution`` (what every phase of the one-call fit can write and differentiate). Pair it
    with :class:`~gpytorch_augment.BernoulliLogitLikelihood` and :class:`~gpytorch_augment.CAVI`.

    :param inducing_points: ``(M, D)`` inducing inputs :math:`Z`.
    :param learn_inducing_locations: whether :math:`Z` is a learnable hyper-parameter (then it appears in
        ``model.hyperparameters()`` and the fit moves it); the demo keeps it fixed.

    Example::

        >>> import torch
        >>> from gpytorch_augment import CAVI, BernoulliLogitLikelihood
        >>> from gpytorch_augment.demo import SparseGPClassifier, kmeans_inducing_points
        >>> x = torch.linspace(-3, 3, 40, dtype=torch.float64).unsqueeze(-1)
        >>> y = (x.squeeze(-1).sin() > 0).double()
        >>> model = SparseGPClassifier(kmeans_inducing_points(x, 8)).double()
        >>> likelihood = BernoulliLogitLikelihood()
        >>> trace = CAVI(model, likelihood, num_data=y.numel()).fit(x, y, learn_hyperparameters=True)
        >>> _ = model.eval()
        >>> with torch.no_grad():
        ...     probs = likelihood(model(x[:5])).probs   # p(y* = 1 | data)
        >>> probs.shape
        torch.Size([5])
    """

    def __init__(self, inducing_points: Tensor, learn_inducing_locations: bool = False) -> None:
        q_u = CholeskyVariationalDistribution(inducing_points.size(-2))
        strategy = CAVIVariationalStrategy(
            self, inducing_points, q_u, learn_inducing_locations=learn_inducing_locations
        )
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

    def forward(self, x: Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))


def kmeans_inducing_points(x: Tensor, num_inducing: int, seed: int = 0, max_iter: int = 100) -> Tensor:
    """``num_inducing`` k-means centres of the rows of ``x``: :func:`~gpytorch_augment.kmeans_plus_plus` (k-means++
    seeding, then up to ``max_iter`` Lloyd iterations, stopping when no assignment changes) with a generator
    seeded by ``seed``, so the same ``seed`` always gives the same centres. Returns a ``(num_inducing, D)`` tensor
    with ``x``'s dtype and device.

    Example::

        >>> import torch
        >>> from gpytorch_augment.demo import kmeans_inducing_points
        >>> x = torch.randn(100, 2, generator=torch.Generator().manual_seed(0))
        >>> kmeans_inducing_points(x, 5).shape
        torch.Size([5, 2])
    """
    generator = torch.Generator(device=getattr(x, "device", "cpu")).manual_seed(seed)
    return kmeans_plus_plus(x, num_inducing, generator, num_iters=max_iter)


@dataclass
class DemoResult:
    """What :func:`main` measured (all per-datum quantities are averages over the data).

    Example::

        >>> from gpytorch_augment.demo import DemoResult
        >>> r = DemoResult(n_train=400, n_test=1060, num_inducing=50, num_steps=10, fit_time=2.4, test_error=0.1075,
        ...                test_nll=0.289, elbo=-0.398, lengthscale=0.59, outputscale=1.6, out=None)
        >>> r.num_inducing, r.out
        (50, None)
    """

    n_train: int
    n_test: int
    num_inducing: int
    num_steps: int  # iterations of the one-call fit
    fit_time: float  # seconds
    test_error: float
    test_nll: float  # mean negative log predictive probability
    elbo: float  # final augmented ELBO per datum
    lengthscale: float
    outputscale: float
    out: str | None


@torch.no_grad()
def predict_proba(
    model: SparseGPClassifier, likelihood: BernoulliLogitLikelihood, x: Tensor, chunk: int = 4096
) -> Tensor:
    """:math:`p(y_* = 1 \\mid \\text{data})` at the rows of ``x`` (eval mode, in chunks).

    Example::

        >>> import torch
        >>> from gpytorch_augment import BernoulliLogitLikelihood
        >>> from gpytorch_augment.demo import SparseGPClassifier, predict_proba
        >>> model = SparseGPClassifier(torch.zeros(3, 1, dtype=torch.float64)).double()
        >>> p = predict_proba(model, BernoulliLogitLikelihood(), torch.zeros(4, 1, dtype=torch.float64))
        >>> [round(v, 2) for v in p.tolist()]          # the prior: 1/2
        [0.5, 0.5, 0.5, 0.5]
    """
    model.eval()
    likelihood.eval()
    return torch.cat([likelihood(model(xc)).probs for xc in x.split(chunk)])


def _plot(
    path: str,
    model: SparseGPClassifier,
    likelihood: BernoulliLogitLikelihood,
    data: Dataset,
    trace: CAVITrace,
    resolution: int,
) -> None:
    """Left: predictive probability surface, training and inducing points. Right: the ELBO trace."""
    # Figure + savefig needs no pyplot and no global backend switch (the Agg canvas writes the .png)
    from matplotlib.figure import Figure

    x, y = data.x_train, data.y_train
    lo, hi = x.min(0).values - 0.3, x.max(0).values + 0.3
    g1, g2 = torch.meshgrid(
        torch.linspace(lo[0], hi[0], resolution, dtype=x.dtype),
        torch.linspace(lo[1], hi[1], resolution, dtype=x.dtype),
        indexing="xy",
    )
    grid = torch.stack([g1.reshape(-1), g2.reshape(-1)], -1)
    probs = predict_proba(model, likelihood, grid).reshape(g1.shape).numpy()
    g1, g2 = g1.numpy(), g2.numpy()

    fig = Figure(figsize=(11, 4.6), dpi=100, layout="constrained")
    ax, ax_elbo = fig.subplots(1, 2, width_ratios=[1.35, 1])
    levels = torch.linspace(0, 1, 21).tolist()
    surface = ax.contourf(g1, g2, probs, levels=levels, cmap="RdBu_r", alpha=0.6)
    ax.contour(g1, g2, probs, levels=[0.5], colors="k", linewidths=1.5)
    for label, colour in ((0, "navy"), (1, "darkred")):
        pts = x[y == label]
        ax.scatter(
            pts[:, 0], pts[:, 1], s=5, c=colour, edgecolors="none", alpha=0.6, label=f"class {data.classes[label]:g}"
        )
    Z = model.variational_strategy.inducing_points.detach()
    ax.scatter(
        Z[:, 0],
        Z[:, 1],
        marker="X",
        s=70,
        c="gold",
        edgecolors="k",
        linewidths=0.8,
        label=f"inducing points (M={Z.shape[0]})",
    )
    ax.set(
        xlabel="$x_1$ (standardised)",
        ylabel="$x_2$ (standardised)",
        title=r"$p(y_*=1 \mid \mathrm{data})$, sparse GP fitted by CAVI",
    )
    ax.legend(loc="lower left", fontsize=8, framealpha=0.9, markerscale=1.5)
    fig.colorbar(surface, ax=ax, ticks=[0, 0.25, 0.5, 0.75, 1], shrink=0.9)

    iterations = range(1, trace.num_steps + 1)
    ax_elbo.plot(iterations, trace.elbo, lw=1.8, marker="o", ms=3, label="fit(x, y, learn_hyperparameters=True)")
    ax_elbo.set(xlabel="iteration", ylabel="objective per datum", title="Training trace")
    ax_elbo.grid(True, alpha=0.3)
    ax_elbo.legend(fontsize=8)
    fig.savefig(path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpytorch_augment.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="demo_banana.png", help="where to save the plot (default: %(default)s)")
    parser.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    parser.add_argument(
        "--fast", action="store_true", default=os.environ.get(FAST_ENV) == "1", help=f"tiny run (or set {FAST_ENV}=1)"
    )
    parser.add_argument("--num-inducing", type=int, default=50, help="M (default: %(default)s)")
    parser.add_argument(
        "--max-iter", type=int, default=None, help="cap on the fit's iterations (default: the fit's own)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the split, k-means and torch (default: %(default)s)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads; every matrix is tiny (M=50), so one thread is fastest and never oversubscribes "
        "a shared CPU (default: %(default)s)",
    )
    return parser


def _fit_and_evaluate(args: argparse.Namespace) -> tuple[DemoResult, CAVITrace]:
    """The demo's fit and test metrics (and the fit's trace)."""
    max_iter = args.max_iter
    torch.manual_seed(args.seed)
    data = load_keel("banana", seed=args.seed, max_train=400 if args.fast else None, dtype=torch.float64)
    x, y = data.x_train, data.y_train

    Z = kmeans_inducing_points(x, args.num_inducing, seed=args.seed)
    model = SparseGPClassifier(Z, learn_inducing_locations=False).double()
    likelihood = BernoulliLogitLikelihood().double()
    cavi = CAVI(model, likelihood, num_data=y.numel())

    start = time.perf_counter()
    options = {} if max_iter is None else {"max_iter": max_iter}
    trace = cavi.fit(x, y, learn_hyperparameters=True, **options)  # q(u), kernel and mean together
    fit_time = time.perf_counter() - start

    probs = predict_proba(model, likelihood, data.x_test)
    p_observed = torch.where(data.y_test > 0, probs, 1 - probs).clamp_min(1e-300)
    result = DemoResult(
        n_train=y.numel(),
        n_test=data.y_test.numel(),
        num_inducing=Z.shape[0],
        num_steps=trace.num_steps,
        fit_time=fit_time,
        test_error=float(((probs > 0.5).to(y.dtype) != data.y_test).to(y.dtype).mean()),
        test_nll=float(-p_observed.log().mean()),
        elbo=float(cavi.elbo(x, y)),
        lengthscale=model.covar_module.base_kernel.lengthscale.item(),
        outputscale=model.covar_module.outputscale.item(),
        out=None if args.no_plot else args.out,
    )
    if result.out is not None:
        _plot(result.out, model, likelihood, data, trace, resolution=60 if args.fast else 150)
    return result, trace


def _report(result: DemoResult, trace: CAVITrace, fast: bool) -> None:
    mode = " (fast mode)" if fast else ""
    print(f"gpytorch-augment demo{mode}: sparse logistic GP classifier on KEEL 'banana', fitted by CAVI")
    print(f"  data            : {result.n_train} train / {result.n_test} test points, 2 features (standardised)")
    print(
        f"  model           : SVGP, M = {result.num_inducing} inducing points (k-means, fixed), "
        "constant mean, scaled RBF"
    )
    status = "converged" if trace.converged else "stopped at its cap"
    print(
        f"  fit             : CAVI(...).fit(x, y, learn_hyperparameters=True), {result.num_steps} iterations "
        f"({status})"
    )
    print(f"  learned kernel  : lengthscale {result.lengthscale:.3f}, outputscale {result.outputscale:.3f}")
    print(f"  fit time        : {result.fit_time:.1f} s")
    print(f"  test error      : {result.test_error:.4f}")
    print(f"  test NLL        : {result.test_nll:.4f}  (mean -log p(y* | data))")
    print(f"  augmented ELBO  : {result.elbo:.4f} per datum ({result.elbo * result.n_train:.1f} nats)")
    if result.out is not None:
        print(f"  plot            : {os.path.abspath(result.out)}")


def main(argv: Sequence[str] | None = None) -> DemoResult:
    """Run the demo (``argv`` as for the command line; ``None`` reads ``sys.argv``) and return its numbers.

    Example::

        >>> from gpytorch_augment.demo import main
        >>> result = main(["--fast", "--no-plot"])  # doctest: +ELLIPSIS
        gpytorch-augment demo (fast mode): sparse logistic GP classifier on KEEL 'banana', fitted by CAVI
        ...
        >>> result.n_train, result.n_test, result.out
        (400, 1060, None)
        >>> bool(result.test_error < 0.2)
        True
    """
    args = _parser().parse_args(argv)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        result, trace = _fit_and_evaluate(args)
    finally:
        torch.set_num_threads(previous_threads)
    _report(result, trace, args.fast)
    if not math.isfinite(result.elbo):  # pragma: no cover - a broken run should not look like a success
        raise FloatingPointError("the augmented ELBO is not finite")
    return result


if __name__ == "__main__":
    main()
