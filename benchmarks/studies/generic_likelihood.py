r"""The cost of the generic augmentation: ``LaplaceTransformLikelihood`` instances against the hand-written
likelihoods they reproduce, per CAVI step and per Gibbs sweep, at N = 10^4 points.

Each pair is built twice on the generic side: from the known family of its mixing law (closed forms, exact draws)
and from :math:`\log\varphi` alone (autograd for CAVI, numerical inversion for Gibbs). Measured, interleaved and
repeated (median of ``--repeats``):

* **CAVI step**: one full-batch ``CAVI.step`` of a sparse variational GP with ``M`` inducing points;
* **local step**: the likelihood's own share of it (``aux_posterior``, ``expected_potential_and_precision`` and
  ``elbo_terms`` on the N marginals);
* **Gibbs sweep**: one sweep of the inducing-point Gibbs sampler (``M`` inducing points), i.e. the draw of every
  :math:`\omega_i` and of the latents.

The ratios are generic / hand-written. ``--quick`` measures fewer repeats at N = 2000.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the shared modules
from _common import close_machine_info, output_dir, run_arguments, start_run  # noqa: E402
from _report import Table, machine_settings, write_report  # noqa: E402

from gpytorch_augment import (  # noqa: E402
    CAVI,
    BernoulliLogitLikelihood,
    GibbsSampler,
    GPPrior,
    LaplaceTransformLikelihood,
    StudentTLikelihood,
)
from gpytorch_augment.likelihoods import GammaMixing, PolyaGammaMixing  # noqa: E402
from gpytorch_augment.testing import make_cavi_model  # noqa: E402

NU, SIGMA = 4.0, 0.5


def _log_phi_pg(r: torch.Tensor) -> torch.Tensor:
    z = torch.sqrt(r / 2)  # -log cosh z, analytic for Re r > 0
    return -(z + torch.log1p(torch.exp(-2 * z)) - math.log(2))


def bernoulli_generic(numerical: bool) -> LaplaceTransformLikelihood:
    return LaplaceTransformLikelihood(
        _log_phi_pg if numerical else PolyaGammaMixing(), log_c=-math.log(2), g=lambda y: y - 0.5, gamma=0.5
    )


def student_t_generic(numerical: bool) -> LaplaceTransformLikelihood:
    a, b = (NU + 1) / 2, NU * SIGMA**2 / 2
    log_c = math.lgamma(a) - math.lgamma(NU / 2) - 0.5 * math.log(math.pi * NU) - math.log(SIGMA)
    mixing = (lambda r: -a * torch.log1p(r / b)) if numerical else GammaMixing(a, b)
    return LaplaceTransformLikelihood(
        mixing, log_c=log_c, alpha=lambda y: y**2 / 2, beta=lambda y: y, gamma=0.5, real_valued_targets=True
    )


#: pair -> (hand-written, generic(numerical), data(x) -> y)
PAIRS: dict[str, tuple[Callable[[], Any], Callable[[bool], Any], Callable[[torch.Tensor], torch.Tensor]]] = {
    "Bernoulli-logit (Pólya-Gamma)": (
        BernoulliLogitLikelihood,
        bernoulli_generic,
        lambda x: torch.bernoulli(torch.sigmoid(3 * torch.sin(2 * x[:, 0]))),
    ),
    "Student-t (Gamma)": (
        lambda: StudentTLikelihood(df=NU, scale=SIGMA, learn_scale=False),
        student_t_generic,
        lambda x: torch.sin(2 * x[:, 0]) + SIGMA * torch.distributions.StudentT(NU).sample((x.size(0),)),
    ),
}


def _median_seconds(run: Callable[[], Any], repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(likelihood: Any, x: torch.Tensor, y: torch.Tensor, num_inducing: int, repeats: int) -> dict[str, float]:
    """Median seconds of one CAVI step, one local step and one Gibbs sweep."""
    likelihood = likelihood.double()
    Z = torch.linspace(-3, 3, num_inducing).unsqueeze(-1)
    model = make_cavi_model(1, Z).double()
    cavi = CAVI(model, likelihood, num_data=y.numel())
    cavi_step = _median_seconds(lambda: cavi.step(x, y), repeats)
    with torch.no_grad():
        q = model(x)
        m, s = q.mean, q.variance

    def local() -> None:
        with torch.no_grad():
            q_aux = likelihood.aux_posterior(y, m, s)
            likelihood.expected_potential_and_precision(y, q_aux, m, s)
            likelihood.elbo_terms(y, q_aux, m, s)

    local_step = _median_seconds(local, repeats)
    prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())).double()
    sampler = GibbsSampler(prior, likelihood, x, y, inducing_points=Z)
    sweeps = 5
    start = time.perf_counter()
    sampler.sample(sweeps, warmup=0, num_chains=1, seed=0, progress=False)
    gibbs = (time.perf_counter() - start) / sweeps
    return {"cavi_step": cavi_step, "local_step": local_step, "gibbs_sweep": gibbs}


def study(n: int, num_inducing: int, repeats: int) -> dict[str, Any]:
    rows = {}
    for name, (hand, generic, data) in PAIRS.items():
        x = torch.rand(n, 1) * 6 - 3
        y = data(x)
        rows[name] = {
            "hand-written": measure(hand(), x, y, num_inducing, repeats),
            "generic, family": measure(generic(False), x, y, num_inducing, repeats),
            "generic, log phi": measure(generic(True), x, y, num_inducing, repeats),
        }
        print(name, rows[name], flush=True)
    return rows


def report(result: dict[str, Any]) -> tuple[str, dict[str, Any], list[Table]]:
    settings = {
        "N": result["n"],
        "M (inducing points)": result["num_inducing"],
        "repeats (median)": result["repeats"],
        **machine_settings(result["machine"]),
    }
    seconds = Table("Seconds", ["likelihood", "variant", "CAVI step", "local step", "Gibbs sweep"])
    ratios = Table("Generic / hand-written", ["likelihood", "variant", "CAVI step", "local step", "Gibbs sweep"])
    keys = ("cavi_step", "local_step", "gibbs_sweep")
    for name, variants in result["rows"].items():
        hand = variants["hand-written"]
        for variant, values in variants.items():
            seconds.rows.append([name, variant, *(f"{values[k]:.4f}" for k in keys)])
            if variant != "hand-written":
                ratios.rows.append([name, variant, *(f"{values[k] / hand[k]:.2f}" for k in keys)])
    return "The generic augmentation against the hand-written likelihoods", settings, [ratios, seconds]


def main(argv: list[str] | None = None) -> None:
    parser = run_arguments(argparse.ArgumentParser(description=__doc__), "N = 2000 and 3 repeats", caps=False)
    args = parser.parse_args(argv)
    machine = start_run(args.threads, args.seed)
    n, repeats = (2000, 3) if args.quick else (10_000, 7)
    rows = study(n, 100, repeats)
    result = {"n": n, "num_inducing": 100, "repeats": repeats, "rows": rows, "machine": close_machine_info(machine)}
    write_report(output_dir(args.output_dir, args.quick), "generic_likelihood", result, *report(result))


if __name__ == "__main__":
    main()
