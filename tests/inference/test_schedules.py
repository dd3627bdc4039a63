"""Step-size schedules of stochastic CAVI (``gpytorch_augment.inference.schedules``)."""

from __future__ import annotations

import pytest
import torch

from gpytorch_augment.inference.schedules import AdaptiveStep, ConstantStep, RobbinsMonro, make_schedule


def test_schedule_values():
    assert ConstantStep(0.25)(0) == ConstantStep(0.25)(1000) == 0.25
    rm = RobbinsMonro(tau=10.0, kappa=0.6)
    assert [rm(t) for t in (0, 5, 90)] == pytest.approx([10**-0.6, 15**-0.6, 100**-0.6])
    assert RobbinsMonro(tau=0.0, kappa=1.0)(0) == 1.0  # (0 + 0)^-1 clipped to 1
    assert RobbinsMonro(tau=0.0, kappa=1.0)(4) == 0.25
    assert RobbinsMonro(tau=1.0, kappa=0.51)(0) == 1.0
    values = [RobbinsMonro()(t) for t in range(100)]
    assert all(0 < b < a <= 1 for a, b in zip(values, values[1:]))
    assert isinstance(make_schedule("robbins-monro", tau=3.0), RobbinsMonro)
    assert make_schedule("Robbins_Monro").kappa == 0.75
    assert isinstance(make_schedule("adaptive"), AdaptiveStep)
    assert make_schedule("constant", rho=0.5)(7) == 0.5
    assert make_schedule(0.5) == 0.5
    fn = lambda t: 0.1  # noqa: E731
    assert make_schedule(fn) is fn


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: RobbinsMonro(kappa=0.5), "kappa"),
        (lambda: RobbinsMonro(kappa=1.1), "kappa"),
        (lambda: RobbinsMonro(tau=-1.0), "tau"),
        (lambda: ConstantStep(0.0), "rho"),
        (lambda: ConstantStep(1.5), "rho"),
        (lambda: AdaptiveStep(num_init=1), "num_init"),
        (lambda: AdaptiveStep(tau_init=0.5), "tau_init"),
        (lambda: make_schedule("cosine"), "unknown step-size schedule"),
        (lambda: make_schedule(0.5, tau=1.0), "keyword"),
        (lambda: make_schedule([0.1]), "step size"),
    ],
)
def test_schedule_validation(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_adaptive_step_follows_the_paper():
    """Ranganath et al. (2013): g = (1-1/tau) g + g_t/tau, h = (1-1/tau) h + |g_t|^2/tau, rho = |g|^2/h,
    tau <- tau (1 - rho) + 1; initialised from the sample mean and the mean-estimate variance."""
    gen = torch.Generator().manual_seed(0)
    samples = torch.randn(4, 6, generator=gen) + 2.0
    schedule = AdaptiveStep(num_init=4)
    schedule.initialize(samples)
    g = samples.mean(0)
    h = float(g.pow(2).sum()) + float((samples - g).pow(2).sum()) / (4 * 3)
    tau = 4.0
    rho = float(g.pow(2).sum()) / h
    assert schedule(0) == pytest.approx(rho, rel=1e-12)
    tau = tau * (1 - rho) + 1
    for t in range(1, 30):
        gt = torch.randn(6, generator=gen) + 2.0 / t
        schedule.observe(gt)
        g = (1 - 1 / tau) * g + gt / tau
        h = (1 - 1 / tau) * h + float(gt.pow(2).sum()) / tau
        rho = float(g.pow(2).sum()) / h
        assert schedule(t) == pytest.approx(rho, rel=1e-10)
        assert 0 < schedule(t) <= 1
        assert schedule.history[-1] == pytest.approx((rho, tau), rel=1e-10)
        tau = tau * (1 - rho) + 1
    # a noiseless constant gradient gives rho = 1
    exact = AdaptiveStep()
    exact.initialize(torch.ones(3, 5))
    assert exact(0) == 1.0
    with pytest.raises(RuntimeError, match="observe"):
        AdaptiveStep()(0)
