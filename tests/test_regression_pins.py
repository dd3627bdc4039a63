r"""Behaviour pins: full-batch and mini-batch CAVI traces and seeded Gibbs and HMC draws, to 1e-6 relative in
float64.

The reference values live in ``tests/data/pins/``, one file per registered likelihood (``<case name>.pt``) and one
for the engine variants run on the Bernoulli case (``engine_variants.pt``); they were computed by this module, and
any refactoring of the numerics must reproduce them. A newly registered likelihood adds its own file::

    python -m tests.test_regression_pins --write                   # writes the missing files only

and never rewrites another's. Rewrite a group only for an intended change of behaviour, by name::

    python -m tests.test_regression_pins --write --force student_t

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
from gpytorch_augment.testing import gp_data
from gpytorch_augment.testing.models import make_cavi_model as _make_model
from tests.inference.test_gibbs import PlainGP
from tests.likelihoods.registry import CASES

PINS = Path(__file__).resolve().parent / "data" / "pins"
#: the pin group of the engine variants (the others are named after their registry case)
ENGINE_VARIANTS = "engine_variants"
#: the pins' tolerance. A change of code moves them by far more; a change of environment alone (numpy, scipy,
#: polyagamma builds) moves them by rounding that the chains compound: up to 2e-7 relative (the heavy-tailed
#: Student-t's Newton solves) after a fresh install on 2026-11-25, against 1e-12 on the machine that wrote them.
RTOL = 1e-6


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
    for name, value in samples.hyper.items():
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
    """The pinned runs of one group (a registry case's name or :data:`ENGINE_VARIANTS`), single-threaded and with
    torch's default dtype float32, the setting the pins were written under (models and data are float64 anyway;
    the default dtype reaches only a few freshly created tensors, and the test suite's own default is float64)."""
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    try:
        if name == ENGINE_VARIANTS:
            return _bernoulli_variants()
        return _case_pins(next(case for case in CASES if case.name == name))
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)


def pin_file(name: str) -> Path:
    return PINS / f"{name}.pt"


@pytest.mark.parametrize("group", GROUPS)
def test_pinned_values_unchanged(group):
    """The group's runs against its pin file: the same runs, the same shapes, values within :data:`RTOL`."""
    path = pin_file(group)
    assert path.exists(), (
        f"no pins for {group!r}: run python -m tests.test_regression_pins --write (it writes missing files only)"
    )
    reference = torch.load(path, weights_only=True)
    computed = compute_group(group)
    assert sorted(computed) == sorted(reference), group
    worst = {}
    for key, values in reference.items():
        assert sorted(computed[key]) == sorted(values), key
        for name, expected in values.items():
            got = computed[key][name]
            assert got.shape == expected.shape, f"{key}:{name}"
            scale = expected.abs().max().clamp_min(1e-300)
            worst[f"{key}:{name}"] = float((got.to(expected) - expected).abs().max() / scale)
    bad = {k: v for k, v in worst.items() if not v <= RTOL}
    assert not bad, f"pinned values moved (max relative error): {bad}"


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
    written = []
    for group in GROUPS:
        if group in force or not pin_file(group).exists():
            torch.save(compute_group(group), pin_file(group))
            written.append(group)
    return written


if __name__ == "__main__":  # pragma: no cover - writes reference files
    if "--write" not in sys.argv:
        raise SystemExit("pass --write to write the missing pin files (--force NAME ... to rewrite groups)")
    args = sys.argv[1:]
    forced = args[args.index("--force") + 1 :] if "--force" in args else []
    print("wrote", write(forced) or "nothing: every group has its pin file")
