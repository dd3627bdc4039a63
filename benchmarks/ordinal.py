"""Ordinal regression: ``OrdinalLogitLikelihood`` fitted by the one-call CAVI fit against GPyTorch's SVGP trained
by Adam on the ``VariationalELBO`` with a cumulative-logit likelihood by Gauss--Hermite quadrature (written here as
the baseline: GPyTorch has no ordinal likelihood).

Data: a synthetic 2-D latent :math:`f(x) = 2.5\\sin(3x_1)\\cos(2x_2) + x_1`, ``K = 5`` classes with cut-points
:math:`(-2, -0.7, 0.7, 2)`, labels drawn from the model; ``N`` training and 2,000 test points; ``M = 64`` inducing
inputs (k-means++) shared by both; both learn the kernel, the cut-points and (the baseline) :math:`q(u)` by
gradient. Measured: wall time of the fit and held-out negative log predictive probability (NLL) and accuracy; the
baseline's time to first reach the augmented fit's NLL + 0.01 (evaluated every 25 Adam steps, evaluation time
excluded).

Run ``python benchmarks/ordinal.py`` (N = 2,000 and 10,000) or ``--quick`` (N = 1,000). Results go to
``results/ordinal{,_quick}.{json,md}``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402
from torch.distributions import Categorical  # noqa: E402

from gpytorch_augment import CAVI, CAVIVariationalStrategy, OrdinalLogitLikelihood, kmeans_plus_plus  # noqa: E402
from gpytorch_augment._numerics import gauss_hermite  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CUTPOINTS = (-2.0, -0.7, 0.7, 2.0)
NUM_INDUCING = 64


def latent(x: Tensor) -> Tensor:
    return 2.5 * torch.sin(3 * x[..., 0]) * torch.cos(2 * x[..., 1]) + x[..., 0]


def make_data(n: int, seed: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=generator, dtype=torch.float64) * 2 - 1
    probs = OrdinalLogitLikelihood(len(CUTPOINTS) + 1, cutpoints=CUTPOINTS).double().forward(latent(x)).probs
    return x, torch.multinomial(probs.detach(), 1, generator=generator).squeeze(-1).double()


class QuadratureOrdinal(gpytorch.likelihoods.Likelihood):
    """The baseline: the cumulative-logit likelihood with ordered cut-points (first + softplus increments), its
    expected log-likelihood and predictive by 20-node Gauss--Hermite quadrature."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.register_parameter("raw_cutpoints", torch.nn.Parameter(torch.linspace(-1, 1, num_classes - 1)))

    @property
    def cutpoints(self) -> Tensor:
        raw = self.raw_cutpoints
        return torch.cat([raw[:1], raw[:1] + torch.nn.functional.softplus(raw[1:]).cumsum(-1)])

    def _log_probs(self, f: Tensor) -> Tensor:
        b = self.cutpoints.to(f)
        cdf = torch.sigmoid(b - f.unsqueeze(-1))
        probs = torch.cat([cdf[..., :1], cdf[..., 1:] - cdf[..., :-1], 1 - cdf[..., -1:]], -1)
        return probs.clamp_min(1e-300).log()

    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Categorical:
        return Categorical(logits=self._log_probs(function_samples))

    def expected_log_prob(self, observations: Tensor, function_dist: Any, *args: Any, **kwargs: Any) -> Tensor:
        nodes, weights = gauss_hermite(function_dist.mean, function_dist.variance, 20)
        log_p = self._log_probs(nodes).gather(-1, observations.long().expand(nodes.shape).unsqueeze(-1)).squeeze(-1)
        return (weights * log_p).sum(0)

    def marginal(self, function_dist: Any, *args: Any, **kwargs: Any) -> Categorical:
        nodes, weights = gauss_hermite(function_dist.mean, function_dist.variance, 20)
        return Categorical(probs=(weights.unsqueeze(-1) * self._log_probs(nodes).exp()).sum(0))


class SVGP(gpytorch.models.ApproximateGP):
    def __init__(self, Z: Tensor, strategy_cls: type) -> None:
        q_u = gpytorch.variational.CholeskyVariationalDistribution(Z.shape[-2])
        super().__init__(strategy_cls(self, Z, q_u, learn_inducing_locations=False))
        self.mean_module = gpytorch.means.ZeroMean()  # a constant mean is confounded with the first cut-point
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def held_out(model: Any, likelihood: Any, x: Tensor, y: Tensor) -> dict[str, float]:
    model.eval()
    likelihood.eval()
    with torch.no_grad():
        probs = likelihood.marginal(model(x)).probs
    model.train()
    likelihood.train()
    return {"nll": float(-probs.gather(-1, y.long().unsqueeze(-1)).clamp_min(1e-300).log().mean()),
            "accuracy": float((probs.argmax(-1) == y.long()).double().mean())}  # fmt: skip


def run(n: int, seed: int, adam_steps: int) -> list[dict[str, Any]]:
    x, y = make_data(n, seed)
    x_test, y_test = make_data(2000, seed + 1)
    Z = kmeans_plus_plus(x, NUM_INDUCING, generator=torch.Generator().manual_seed(seed))
    rows = []
    # the augmented model: the one-call fit
    model = SVGP(Z.clone(), CAVIVariationalStrategy).double()
    likelihood = OrdinalLogitLikelihood(len(CUTPOINTS) + 1).double()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        CAVI(model, likelihood, num_data=n).fit(x, y, learn_hyperparameters=True)
    seconds = time.perf_counter() - start
    ours = held_out(model, likelihood, x_test, y_test)
    rows.append({"N": n, "method": "augmented CAVI (one-call fit)", "fit_s": seconds, **ours, "time_to_target_s": None})
    # the baseline: SVGP + Adam on the true ELBO (full batch up to 2,000 points, else mini-batches of 1,024)
    model = SVGP(Z.clone(), gpytorch.variational.VariationalStrategy).double()
    likelihood = QuadratureOrdinal(len(CUTPOINTS) + 1).double()
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=n)
    optimizer = torch.optim.Adam([*model.parameters(), *likelihood.parameters()], lr=0.02)
    generator = torch.Generator().manual_seed(seed)
    batch = n if n <= 2000 else 1024
    elapsed, reached = 0.0, None
    for step in range(1, adam_steps + 1):
        start = time.perf_counter()
        idx = torch.randperm(n, generator=generator)[:batch]
        optimizer.zero_grad()
        (-mll(model(x[idx]), y[idx])).backward()
        optimizer.step()
        elapsed += time.perf_counter() - start
        if step % 25 == 0 and reached is None:
            if held_out(model, likelihood, x_test, y_test)["nll"] <= ours["nll"] + 0.01:
                reached = elapsed
    rows.append({"N": n, "method": f"SVGP + Adam ({adam_steps} steps, batch {batch})", "fit_s": elapsed,
                 **held_out(model, likelihood, x_test, y_test), "time_to_target_s": reached})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 1,000 only, 600 Adam steps")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    machine = common.start_run(threads=args.threads, seed=0)
    sizes, steps = ([1000], 600) if args.quick else ([2000, 10000], 3000)
    rows = [row for n in sizes for row in run(n, seed=n, adam_steps=steps)]
    machine = common.close_machine_info(machine)
    table = _report.Table("Held-out ordinal prediction", ["N", "method", "fit [s]", "test NLL", "accuracy",
                          "baseline time to NLL + 0.01 [s]"], [[r["N"], r["method"], r["fit_s"], r["nll"],
                          r["accuracy"], r["time_to_target_s"]] for r in rows])  # fmt: skip
    settings = {"N": ", ".join(map(str, sizes)), "classes": len(CUTPOINTS) + 1, "M": NUM_INDUCING,
                "test points": 2000, **_report.machine_settings(machine)}  # fmt: skip
    name = "ordinal_quick" if args.quick else "ordinal"
    _report.write_report(RESULTS, name, {"rows": rows, "machine": machine},
                         "Ordinal regression: augmented CAVI against SVGP + Adam", settings, [table])


if __name__ == "__main__":
    main()
