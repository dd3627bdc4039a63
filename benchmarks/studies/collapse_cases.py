r"""The collapse cases of the one-call fit: the README's SVGP recipe as a GPyTorch user writes it (an ARD RBF kernel at
GPyTorch's initial values, no priors) on data with ten or more inputs, fitted by ``CAVI(...).fit(x, y,
learn_hyperparameters=True)``.

Two settings per case, declared before any run:

* **before** -- the fit as it was: maximum likelihood from GPyTorch's start, no restart
  (``hyper_options={"priors": False, "initialise": False, "collapse_restarts": 0}``);
* **after** -- every default: MAP under the default hyper-priors, the data-aware start, restarts after a collapse.

The cases: ten standard-normal inputs with the label a noiseless function of three (ARD; and twenty inputs with
one lengthscale), scikit-learn's breast-cancer data (30 inputs), a digits subset (64 inputs, 10 classes) and an
ordinal task with ten inputs. Each is split 80/20 (seed 0); inputs standardised on the training part. Reported:
the fit's status, whether the final predictor is constant, training and test accuracy and test NLL, and the time.

Run ``python benchmarks/studies/collapse_cases.py``; results go to ``results/collapse_cases.{json,md}``
(the committed ``.md`` predates the shared renderer).
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the shared modules

import _common as common  # noqa: E402
import _report  # noqa: E402
import gpytorch  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from gpytorch_augment import (  # noqa: E402
    CAVI,
    BernoulliLogitLikelihood,
    CAVIVariationalStrategy,
    LogisticSoftmaxLikelihood,
    OrdinalLogitLikelihood,
)
from gpytorch_augment.inference.collapse import is_constant  # noqa: E402

SETTINGS = {
    "before": {"priors": False, "initialise": False, "collapse_restarts": 0},
    "after": {},
}
NUM_INDUCING = 50


class Model(gpytorch.models.ApproximateGP):
    """The README's SVGP with an ARD (or shared-lengthscale) RBF kernel at GPyTorch's initial values, ``T`` latents."""

    def __init__(self, Z: Tensor, T: int, ard: bool) -> None:
        batch = torch.Size([T]) if T > 1 else torch.Size()
        q_u = gpytorch.variational.CholeskyVariationalDistribution(Z.size(0), batch_shape=batch)
        strategy = CAVIVariationalStrategy(self, Z, q_u)
        if T > 1:
            strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(strategy, num_tasks=T)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        kernel = gpytorch.kernels.RBFKernel(ard_num_dims=Z.size(-1) if ard else None, batch_shape=batch)
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel, batch_shape=batch)

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _split(x: np.ndarray, y: np.ndarray, seed: int = 0) -> dict[str, Tensor]:
    perm = np.random.RandomState(seed).permutation(len(y))
    n_test = len(y) // 5
    test, train = perm[:n_test], perm[n_test:]
    mu, sd = x[train].mean(0), x[train].std(0)
    sd = np.where(sd > 0, sd, 1.0)
    t = lambda a: torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float64)  # noqa: E731
    return {"x": t((x[train] - mu) / sd), "y": t(y[train]), "xt": t((x[test] - mu) / sd), "yt": t(y[test])}


def cases() -> dict[str, dict[str, Any]]:
    from sklearn.datasets import load_breast_cancer, load_digits

    g = np.random.RandomState(0)
    x10 = g.randn(375, 10)
    x20 = g.randn(375, 20)
    digits = load_digits()
    keep = g.permutation(len(digits.target))[:500]
    xo = g.randn(500, 10)
    latent = xo[:, 0] + xo[:, 1] - 0.5 * xo[:, 2] + 0.5 * g.randn(500)
    ordinal = np.digitize(latent, np.quantile(latent, [0.25, 0.5, 0.75]))
    cancer = load_breast_cancer()
    return {
        "10 inputs, ARD": {**_split(x10, (x10[:, :3].sum(1) > 0).astype(float)), "kind": "binary", "ard": True},
        "20 inputs, one lengthscale": {**_split(x20, (x20[:, :3].sum(1) > 0).astype(float)), "kind": "binary",
                                       "ard": False},  # fmt: skip
        "breast cancer (30 inputs, ARD)": {**_split(cancer.data, cancer.target.astype(float)), "kind": "binary",
                                           "ard": True},  # fmt: skip
        "digits (64 inputs, 10 classes, ARD)": {**_split(digits.data[keep], digits.target[keep].astype(float)),
                                                "kind": "multiclass", "K": 10, "ard": True},  # fmt: skip
        "ordinal (10 inputs, 4 levels, ARD)": {**_split(xo, ordinal.astype(float)), "kind": "ordinal", "K": 4,
                                               "ard": True},  # fmt: skip
    }


def _likelihood(case: dict[str, Any]) -> Any:
    if case["kind"] == "binary":
        return BernoulliLogitLikelihood()
    if case["kind"] == "multiclass":
        return LogisticSoftmaxLikelihood(num_classes=case["K"]).double()
    return OrdinalLogitLikelihood(case["K"]).double()


def _metrics(likelihood: Any, model: Model, x: Tensor, y: Tensor, kind: str) -> tuple[float, float]:
    """Accuracy and NLL of the predictive at ``x``."""
    model.eval()
    with torch.no_grad():
        predictive = likelihood(model(x))
        if kind == "binary":
            p = predictive.probs
            accuracy = float(((p > 0.5).double() == y).double().mean())
            nll = float(-(y * p.clamp_min(1e-12).log() + (1 - y) * (1 - p).clamp_min(1e-12).log()).mean())
        else:
            probs = predictive.probs
            accuracy = float((probs.argmax(-1) == y.long()).double().mean())
            nll = float(-probs.gather(-1, y.long().unsqueeze(-1)).clamp_min(1e-12).log().mean())
    model.train()
    return accuracy, nll


def run(name: str, case: dict[str, Any], setting: str) -> dict[str, Any]:
    x, y = case["x"], case["y"]
    likelihood = _likelihood(case)
    T = likelihood.num_latents if case["kind"] == "multiclass" else 1
    Z = common.kmeans_inducing_points(x, NUM_INDUCING, seed=0)
    model = Model(Z, T, case["ard"]).double()
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CAVI(model, likelihood, num_data=len(y)).fit(x, y, learn_hyperparameters=True,
                                                              hyper_options=SETTINGS[setting])  # fmt: skip
    wall = time.perf_counter() - start
    constant = is_constant(model, x, T)
    train_accuracy, _ = _metrics(likelihood, model, x, y, case["kind"])
    test_accuracy, test_nll = _metrics(likelihood, model, case["xt"], case["yt"], case["kind"])
    record = {"case": name, "setting": setting, "status": result.status.value, "attempts": result.attempts,
              "constant": constant, "train_accuracy": train_accuracy, "test_accuracy": test_accuracy,
              "test_nll": test_nll, "time": wall, "iterations": result.num_steps,
              "warnings": [str(w.message)[:160] for w in caught]}  # fmt: skip
    print(f"{name:38s} {setting:7s} {record['status']:15s} constant={constant!s:5s} train acc {train_accuracy:.3f} "
          f"test acc {test_accuracy:.3f} test NLL {test_nll:.4f} {wall:6.1f}s", flush=True)  # fmt: skip
    return record


def main() -> list[dict[str, Any]]:
    common.configure_torch(threads=1)
    machine = common.machine_info()
    records = [run(name, case, setting) for name, case in cases().items() for setting in SETTINGS]
    rows = [[r["case"], r["setting"], r["status"], r["constant"], r["train_accuracy"], r["test_accuracy"],
             r["test_nll"], r["time"]] for r in records]  # fmt: skip
    table = _report.Table("Cases", ["case", "fit", "status", "constant", "train accuracy", "test accuracy", "test NLL",
                                    "time (s)"], rows)  # fmt: skip
    settings = {"before": str(SETTINGS["before"]), "after": "every default", "inducing points": NUM_INDUCING,
                **_report.machine_settings(common.close_machine_info(machine))}  # fmt: skip
    _report.write_report(common.RESULTS_DIR, "collapse_cases", {"settings": SETTINGS, "records": records},
                         "The collapse cases, before and after", settings, [table])  # fmt: skip
    return records


if __name__ == "__main__":
    main()
