r"""Behaviour pins: full-batch and mini-batch CAVI traces and seeded Gibbs and HMC draws in float64, each to the
precision its computation supports.

The reference values live in ``tests/data/pins/``, one file per registered likelihood (``<case name>.pt``) and one
for the engine variants run on the Bernoulli case (``engine_variants.pt``); they were computed by this module, and
any refactoring of the numerics must reproduce them. A newly registered likelihood adds its own file::

    python -m tests.test_regression_pins --write                   # writes the missing files only

and never rewrites another's. Rewrite a group only for an intended change of behaviour, by name::

    python -m tests.test_regression_pins --write --force student_t

**Tolerances.** Another CPU (another ``ATEN_CPU_CAPABILITY`` kernel path, another BLAS code path or thread count)
rounds the last bits of every operation differently, and a chain compounds them: a pin holds to rounding only where
its quantity is a well-conditioned function of the inputs. So every pinned quantity carries its own relative
tolerance, derived from the computation when the pin is written, as the largest of

* :data:`FLOOR`, ``1e-10``: float64 rounding through the Cholesky solves of kernel matrices of condition number up
  to ~1e6 (:math:`\kappa\varepsilon \approx 10^{-10}`);
* :data:`MARGIN` times the largest difference between this machine's run and its runs under the other kernel paths
  (:data:`OTHER_PATHS`: PyTorch's portable ``default`` and ``avx2`` kernels, MKL's compatible code path), each in a
  subprocess: the rounding that Newton solves' stopping decisions and long trajectories amplify;
* the quantity's linear response to rounding its inputs to float32 (relative :math:`2^{-24}`), scaled down to a
  perturbation of :data:`ROUNDING`.

A value that moves by more than :data:`DISCONTINUOUS` under either perturbation (an accept/reject decision flipped:
no linear response moves a value that far) is held to its shape only (tolerance 1). Rewrite a group's pins only on
this machine's native path (no ``ATEN_CPU_CAPABILITY`` set).

Every registered likelihood is pinned under full-batch CAVI (whitened, Cholesky q(u)), under the exact, over-relaxed
and inducing-point (α = 0 and 0.5) Gibbs samplers and under HMC (joint and diagonal curvature); the Bernoulli case
also under every variational distribution, the unwhitened strategy, mini-batch schedules and the fused
hyper-parameter step (``engine_variants``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import gpytorch
import pytest
import torch

from gpytorch_augment import CAVI, BernoulliLogitLikelihood, GibbsSampler, HMCSampler, UnwhitenedCAVIVariationalStrategy
from gpytorch_augment.testing import gp_data as _gp_data
from gpytorch_augment.testing.models import make_cavi_model as _make_model
from tests.inference.test_gibbs import PlainGP
from tests.likelihoods.registry import CASES

PINS = Path(__file__).resolve().parent / "data" / "pins"
#: the pin group of the engine variants (the others are named after their registry case)
ENGINE_VARIANTS = "engine_variants"
#: the relative input perturbation that last-bit differences add up to (~500 float64 ulps)
ROUNDING = 1e-13
#: the smallest tolerance (module docstring)
FLOOR = 1e-10
#: the factor on the differences seen between kernel paths when the pins were written
MARGIN = 100.0
#: the other kernel paths the pins' writer runs (environment settings)
OTHER_PATHS = ({"ATEN_CPU_CAPABILITY": "default"}, {"ATEN_CPU_CAPABILITY": "avx2"}, {"MKL_CBWR": "COMPATIBLE"})
#: a relative change under a perturbation above which a value is taken to move discontinuously
DISCONTINUOUS = 1e-3
#: whether the inputs are rounded to float32 (the perturbed run that derives the tolerances)
_PERTURBED = {"on": False}


def gp_data(case, n: int):
    """The pinned runs' data: :func:`~gpytorch_augment.testing.gp_data` in float64, its inputs rounded to float32
    in the perturbed run."""
    data = _gp_data(case, n=n)
    if _PERTURBED["on"]:
        data.x = data.x.float().double()
        if data.y.is_floating_point():
            data.y = data.y.float().double()
    return data


def _q_u(model) -> list[torch.Tensor]:
    """The variational distribution's parameters (detached copies)."""
    return [p.detach().clone() for p in model.variational_parameters()]


def _cavi_run(case, steps: int = 4, **model_kwargs) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    data = gp_data(case, n=30)
    Z = torch.linspace(-3, 3, 7, dtype=torch.float64).unsqueeze(-1)
    model = _make_model(case.num_latents, Z, **model_kwargs).double()
    cavi = CAVI(model, data.likelihood, num_data=data.y.shape[-1])
    trace = [float(cavi.step(data.x, data.y, **data.kwargs)) for _ in range(steps)]
    trace.append(float(cavi.elbo(data.x, data.y, **data.kwargs)))
    out = {"trace": torch.tensor(trace, dtype=torch.float64)}
    for i, p in enumerate(_q_u(model)):
        out[f"q{i}"] = p
    for name, p in data.likelihood.named_parameters():
        out[f"lik.{name}"] = p.detach().clone()
    return out


def _bernoulli_variants() -> dict[str, dict[str, torch.Tensor]]:
    case = next(c for c in CASES if c.name.startswith("bernoulli"))
    out = {}
    dists = {
        "natural": gpytorch.variational.NaturalVariationalDistribution,
        "trilnatural": gpytorch.variational.TrilNaturalVariationalDistribution,
    }
    for name, cls in dists.items():
        out[f"cavi/bernoulli/{name}"] = _cavi_run(case, distribution_cls=cls)
        out[f"cavi/bernoulli/{name}/unwhitened"] = _cavi_run(
            case, distribution_cls=cls, strategy_cls=UnwhitenedCAVIVariationalStrategy
        )
    out["cavi/bernoulli/cholesky/unwhitened"] = _cavi_run(case, strategy_cls=UnwhitenedCAVIVariationalStrategy)

    # mini-batch schedules and the fused / unfused hyper-parameter steps
    for schedule in ("robbins-monro", "adaptive", 0.5):
        for strategy_cls in (None, UnwhitenedCAVIVariationalStrategy):
            torch.manual_seed(0)
            data = gp_data(case, n=30)
            Z = torch.linspace(-3, 3, 7, dtype=torch.float64).unsqueeze(-1)
            kwargs = {} if strategy_cls is None else {"strategy_cls": strategy_cls}
            model = _make_model(1, Z, **kwargs).double()
            cavi = CAVI(model, data.likelihood, num_data=30, step_size=schedule)
            hyper = torch.optim.Adam(model.hyperparameters(), lr=0.05)
            trace = cavi.fit(
                data.x, data.y, batch_size=8, num_epochs=3, hyper_optimizer=hyper,
                generator=torch.Generator().manual_seed(3),
            )
            key = f"fit/bernoulli/{schedule}/{'unwhitened' if strategy_cls else 'whitened'}"
            out[key] = {"trace": torch.tensor(trace.elbo, dtype=torch.float64)}
            for i, p in enumerate(_q_u(model)):
                out[key][f"q{i}"] = p
            for name, p in model.named_hyperparameters():
                out[key][f"hyper.{name}"] = p.detach().clone()
    # full batch with hyper-parameter steps (fused path) and hyper_steps > 1
    torch.manual_seed(0)
    data = gp_data(case, n=30)
    Z = torch.linspace(-3, 3, 7, dtype=torch.float64).unsqueeze(-1)
    model = _make_model(1, Z).double()
    cavi = CAVI(model, data.likelihood, num_data=30)
    hyper = torch.optim.Adam(model.hyperparameters(), lr=0.05)
    trace = cavi.fit(data.x, data.y, max_iter=6, hyper_optimizer=hyper, hyper_steps=2)
    out["fit/bernoulli/full/hyper"] = {"trace": torch.tensor(trace.elbo, dtype=torch.float64)}
    for i, p in enumerate(_q_u(model)):
        out["fit/bernoulli/full/hyper"][f"q{i}"] = p
    return out


def _gibbs_run(case, sampler_class=GibbsSampler, **sampler_kwargs) -> dict[str, torch.Tensor] | None:
    data = gp_data(case, n=20)
    if sampler_class is HMCSampler and getattr(data.likelihood, "samples_constants", False):
        return None  # HMC keeps the constants fixed and refuses a prior on them
    T = case.num_latents
    model = PlainGP(mean_constant=0.3, batch_shape=torch.Size([T]) if T > 1 else torch.Size()).double()
    sampler = sampler_class(model, data.likelihood, data.x, data.y, **sampler_kwargs, **data.kwargs)
    samples = sampler.sample(6, warmup=3, num_chains=3, seed=11, progress=False)
    out = {"f": samples.f.clone()}
    if samples.u is not None:
        out["u"] = samples.u.clone()
    for name, value in samples.aux.items():
        out[f"aux.{name}"] = value.to(torch.float64).clone()
    for name, value in samples.hyperparameters.items():
        out[f"hyper.{name}"] = value.to(torch.float64).clone()
    return out


def _case_pins(case) -> dict[str, dict[str, torch.Tensor]]:
    """Every pinned run of one registered likelihood, keyed by a readable name."""
    pins: dict[str, dict[str, torch.Tensor]] = {}
    pins[f"cavi/{case.name}"] = _cavi_run(case)
    pins[f"gibbs/{case.name}/exact"] = _gibbs_run(case)
    pins[f"gibbs/{case.name}/overrelaxed"] = _gibbs_run(case, overrelaxation=-0.6)
    pins[f"gibbs/{case.name}/whitened"] = _gibbs_run(case, f_update="whitened")
    Z = torch.linspace(-3, 3, 6, dtype=torch.float64).unsqueeze(-1)
    pins[f"gibbs/{case.name}/sparse"] = _gibbs_run(case, inducing_points=Z)
    pins[f"gibbs/{case.name}/sparse-alpha"] = _gibbs_run(case, inducing_points=Z, alpha=0.5)
    for curvature in ("joint", "diagonal") if case.num_latents > 1 else ("joint",):
        hmc = _gibbs_run(case, HMCSampler, curvature=curvature)
        if hmc is not None:
            pins[f"hmc/{case.name}/{curvature}"] = hmc
    return pins


#: the pin groups: one per registered likelihood, plus the engine variants
GROUPS = [case.name for case in CASES] + [ENGINE_VARIANTS]


def compute_group(name: str) -> dict[str, dict[str, torch.Tensor]]:
    """The pinned runs of one group (a registry case's name or :data:`ENGINE_VARIANTS`), single-threaded with
    torch's default dtype float64 (the data, the models and the engines' fresh tensors alike)."""
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    try:
        if name == ENGINE_VARIANTS:
            return _bernoulli_variants()
        return _case_pins(next(case for case in CASES if case.name == name))
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.abs().max().clamp_min(1e-300)
    return float((got.to(expected) - expected).abs().max() / scale)


def derive_pins(name: str, elsewhere: list[dict[str, dict[str, torch.Tensor]]]) -> dict[str, dict]:
    """The pin file of a group: its values, and each value's tolerance (module docstring) from the perturbed run
    and from the group's runs on the other kernel paths (``elsewhere``)."""
    values = compute_group(name)
    _PERTURBED["on"] = True
    try:
        perturbed = compute_group(name)
    finally:
        _PERTURBED["on"] = False
    rtol = {
        key: {
            k: tolerance(_relative(perturbed[key][k], v), max(_relative(run[key][k], v) for run in elsewhere))
            for k, v in run.items()
        }
        for key, run in values.items()
    }
    return {"values": values, "rtol": rtol}


def tolerance(response: float, path_difference: float) -> float:
    """A value's tolerance from its relative ``response`` to the float32 rounding of the inputs and its largest
    relative difference between kernel paths (module docstring)."""
    if not (response <= DISCONTINUOUS and path_difference <= DISCONTINUOUS):
        return 1.0
    return max(FLOOR, MARGIN * path_difference, response / 2.0**-24 * ROUNDING)


def _other_paths(groups: list[str]) -> list[dict[str, dict[str, dict[str, torch.Tensor]]]]:
    """Every group's runs under each of :data:`OTHER_PATHS`, each computed in a subprocess."""
    import os
    import subprocess
    import tempfile

    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for i, env in enumerate(OTHER_PATHS):
            out = Path(folder) / f"{i}.pt"
            command = [sys.executable, "-m", "tests.test_regression_pins", "--compute", str(out), *groups]
            subprocess.run(command, env={**os.environ, **env}, check=True, cwd=Path(__file__).resolve().parents[1])
            runs.append(torch.load(out, weights_only=True))
    return runs


def pin_file(name: str) -> Path:
    return PINS / f"{name}.pt"


@pytest.mark.parametrize("group", GROUPS)
def test_pinned_values_unchanged(group):
    """The group's runs against its pin file: the same runs, the same shapes, each value within its tolerance."""
    path = pin_file(group)
    assert path.exists(), (
        f"no pins for {group!r}: run python -m tests.test_regression_pins --write (it writes missing files only)"
    )
    pins = torch.load(path, weights_only=True)
    reference, rtol = pins["values"], pins["rtol"]
    computed = compute_group(group)
    assert sorted(computed) == sorted(reference), group
    bad = {}
    for key, values in reference.items():
        assert sorted(computed[key]) == sorted(values), key
        for name, expected in values.items():
            got = computed[key][name]
            assert got.shape == expected.shape, f"{key}:{name}"
            error = _relative(got, expected)
            if not error <= rtol[key][name]:
                bad[f"{key}:{name}"] = f"{error:.2g} > {rtol[key][name]:.2g}"
    assert not bad, f"pinned values moved (relative error > tolerance): {bad}"


def test_every_pin_file_belongs_to_a_group():
    orphans = sorted(p.stem for p in PINS.glob("*.pt") if p.stem not in GROUPS)
    assert not orphans, f"pin files of no registered case: {orphans} (a case renamed or removed?)"
    assert BernoulliLogitLikelihood is not None  # the engine variants run on the Bernoulli case


def write(force: list[str]) -> list[str]:
    """Write the pin files that are missing, and those of the groups in ``force``; the names written."""
    unknown = sorted(set(force) - set(GROUPS))
    if unknown:
        raise SystemExit(f"no pin group {unknown}; the groups are {GROUPS}")
    PINS.mkdir(parents=True, exist_ok=True)
    groups = [group for group in GROUPS if group in force or not pin_file(group).exists()]
    elsewhere = _other_paths(groups) if groups else []
    for group in groups:
        torch.save(derive_pins(group, [run[group] for run in elsewhere]), pin_file(group))
    return groups


if __name__ == "__main__":  # pragma: no cover - writes reference files
    args = sys.argv[1:]
    if args[:1] == ["--compute"]:  # a subprocess of write(): the groups' runs on this process's kernel path
        torch.save({group: compute_group(group) for group in args[2:]}, args[1])
        raise SystemExit(0)
    if "--write" not in args:
        raise SystemExit("pass --write to write the missing pin files (--force NAME ... to rewrite groups)")
    forced = args[args.index("--force") + 1 :] if "--force" in args else []
    print("wrote", write(forced) or "nothing: every group has its pin file")
