"""``PosteriorSummary`` prints as a table (one row per coordinate, ArviZ's columns where available), truncated."""

from __future__ import annotations

import torch

from gpytorch_augment.inference.mcmc.summary import SUMMARY_ROWS, PosteriorSummary


def _summary(shape: tuple[int, ...], name: str = "f") -> PosteriorSummary:
    values = torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)
    return PosteriorSummary(
        mean=values / 10, sd=values / 100 + 0.5, rhat=torch.ones(shape), ess_bulk=400 + values,
        q05=values / 10 - 1, q95=values / 10 + 1, name=name,
    )  # fmt: skip


def test_a_short_summary_is_a_full_table() -> None:
    text = repr(_summary((3,)))
    lines = text.splitlines()
    assert lines[0].split() == ["mean", "sd", "q05", "q95", "ess_bulk", "rhat"]
    assert [line.split()[0] for line in lines[1:]] == ["f[0]", "f[1]", "f[2]"]
    assert lines[2].split()[1:] == ["0.100", "0.510", "-0.900", "1.100", "401", "1.00"]
    assert "more rows" not in text and "tensor" not in text
    assert str(_summary((3,))) == text


def test_a_long_summary_is_truncated_with_a_count() -> None:
    lines = repr(_summary((3, 50), name="omega")).splitlines()
    assert len(lines) == 1 + SUMMARY_ROWS + 1
    assert lines[1].startswith("omega[0, 0] ") and lines[-2].startswith(f"omega[0, {SUMMARY_ROWS - 1}] ")
    assert lines[-1] == f"... {150 - SUMMARY_ROWS} more rows"


def test_a_scalar_and_missing_columns() -> None:
    summary = PosteriorSummary(mean=torch.tensor(2.0), sd=torch.tensor(0.1), rhat=torch.tensor(float("nan")),
                           ess_bulk=torch.tensor(12.0), name="max_precision")  # fmt: skip
    lines = repr(summary).splitlines()
    assert lines[0].split() == ["mean", "sd", "ess_bulk", "rhat"]
    assert lines[1].split() == ["max_precision", "2.000", "0.100", "12", "nan"]


def test_samples_summary_fills_the_quantiles(tmp_path) -> None:
    import gpytorch

    from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior

    x = torch.linspace(-2, 2, 6, dtype=torch.float64).unsqueeze(-1)
    prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
    samples = GibbsSampler(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double()).sample(
        10, warmup=5, num_chains=2, seed=0, progress=False
    )
    summary = samples.summary()
    assert summary.name == "f" and (summary.q05 <= summary.mean).all() and (summary.mean <= summary.q95).all()
    assert len(repr(summary).splitlines()) == 1 + 6


def test_summary_marks_coordinates_fixed_at_zero_with_a_note():
    """The ordinal likelihood's omega_upper is 0 for the top class (its factor is absent): R-hat and ESS are NaN
    there, which the table showed without a word."""
    from gpytorch_augment import GibbsSampler, OrdinalLogitLikelihood
    from gpytorch_augment.testing import make_cavi_model

    x = torch.linspace(-1.0, 1.0, 6, dtype=torch.float64).unsqueeze(-1)
    y = torch.tensor([0.0, 1.0, 2.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    sampler = GibbsSampler(make_cavi_model(1, x).double(), OrdinalLogitLikelihood(3).double(), x, y)
    samples = sampler.sample(6, warmup=2, num_chains=2, seed=0, progress=False)
    summary = samples.summary("omega_upper")
    top = y == 2
    assert torch.equal(summary.constant, top)
    assert bool(summary.rhat[top].isnan().all()) and bool(summary.rhat[~top].isfinite().all())
    lines = repr(summary).splitlines()
    assert [line.split()[0] for line in lines[1:7] if line.split()[1] == "*"] == ["omega_upper[2]", "omega_upper[5]"]
    assert lines[-1].startswith("* constant over every draw (2 of 6") and "undefined (nan)" in lines[-1]
    assert "constant over every draw" not in repr(samples.summary("f"))


def test_printed_columns_are_the_attribute_names_with_tail_and_sd_ess() -> None:
    import gpytorch

    from gpytorch_augment import BernoulliLogitLikelihood, GibbsSampler, GPPrior

    x = torch.linspace(-2, 2, 6, dtype=torch.float64).unsqueeze(-1)
    prior = GPPrior(gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel())
    samples = GibbsSampler(prior, BernoulliLogitLikelihood(), x, (x.squeeze(-1) > 0).double()).sample(
        20, warmup=5, num_chains=2, seed=0, progress=False
    )
    summary = samples.summary()
    columns = repr(summary).splitlines()[0].split()
    assert columns == ["mean", "sd", "q05", "q95", "ess_bulk", "ess_tail", "ess_sd", "rhat"]
    for column in columns:  # one naming: every printed column is an attribute holding one value per coordinate
        assert getattr(summary, column).shape == (6,)
