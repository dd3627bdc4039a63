"""The engines on a CUDA device (skipped where none is present): CAVI full-batch and mini-batch fits, the Gibbs
sampler, Pólya-Gamma draws and the multi-process path with CUDA tensors must give the CPU results (float64)."""

from __future__ import annotations

import pytest
import torch

from gpytorch_augment import CAVI, BernoulliLogitLikelihood, GibbsSampler, PolyaGamma
from tests.inference.test_gibbs import PlainGP
from tests.models import SVGP

# marked `device`: `make gpu-check` selects it with the device-fixture tests (`pytest --device cuda -m device`)
pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"), pytest.mark.device]


def _data(device: str, n: int = 80):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 1, generator=g, dtype=torch.float64) * 6 - 3
    y = torch.bernoulli(torch.sigmoid(0.5 + torch.sin(2 * x.squeeze(-1))), generator=g)
    z = torch.linspace(-3, 3, 10, dtype=torch.float64).unsqueeze(-1)
    return x.to(device), y.to(device), z.to(device)


def _fit(device: str, **kwargs):
    x, y, z = _data(device)
    model = SVGP(z, mean_constant=0.3).double().to(device)
    cavi = CAVI(model, BernoulliLogitLikelihood().to(device), num_data=len(y))
    trace = cavi.fit(x, y, **kwargs)
    return trace, [p.detach().cpu() for p in model.variational_parameters()]


def test_full_batch_cavi_on_cuda_matches_cpu():
    cpu, q_cpu = _fit("cpu", max_iter=10)
    gpu, q_gpu = _fit("cuda", max_iter=10)
    assert gpu.elbo == pytest.approx(cpu.elbo, rel=1e-9)
    for a, b in zip(q_gpu, q_cpu):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_minibatch_fit_with_a_cpu_generator_and_cuda_data():
    """The documented ``generator=torch.Generator().manual_seed(0)`` works with CUDA data (same batches)."""
    kwargs = {"batch_size": 20, "num_epochs": 2}
    cpu, q_cpu = _fit("cpu", generator=torch.Generator().manual_seed(0), **kwargs)
    gpu, q_gpu = _fit("cuda", generator=torch.Generator().manual_seed(0), **kwargs)
    assert gpu.elbo == pytest.approx(cpu.elbo, rel=1e-8)


def test_gibbs_on_cuda_runs_and_agrees_in_distribution():
    x, y, _ = _data("cuda", n=30)
    sampler = GibbsSampler(PlainGP(mean_constant=0.3).double().cuda(), BernoulliLogitLikelihood(), x, y)
    samples = sampler.sample(200, warmup=50, num_chains=4, seed=0, progress=False)
    assert samples.f.device.type == "cuda" and torch.isfinite(samples.f).all()
    x_cpu, y_cpu = x.cpu(), y.cpu()
    reference = GibbsSampler(PlainGP(mean_constant=0.3).double(), BernoulliLogitLikelihood(), x_cpu, y_cpu).sample(
        200, warmup=50, num_chains=4, seed=1, progress=False
    )
    diff = samples.f.cpu().mean((0, 1)) - reference.f.mean((0, 1))
    se = (samples.f.cpu().var((0, 1)) / 200 + reference.f.var((0, 1)) / 200).sqrt()
    assert (diff.abs() / se).max() < 6


def test_polya_gamma_draws_on_cuda_have_the_right_moments():
    b = torch.full((20_000,), 1.5, device="cuda", dtype=torch.float64)
    c = torch.full_like(b, 2.0)
    q = PolyaGamma(b, c)
    draws = q.sample()
    assert draws.device.type == "cuda"
    assert float(draws.mean()) == pytest.approx(float(q.mean[0]), rel=0.02)


def test_a_minibatch_cavi_step_on_checked_data_synchronises_at_most_twice():
    """CUDA's sync debug mode counts one step of a fit (data checked once, beforehand: ``CAVI.check_data``): the
    kernel factorisation's failure check (GPyTorch's jitter retry) and GPyTorch's equal-inputs test in the RBF
    kernel, nothing of ours."""
    import warnings

    x, y, z = _data("cuda")
    model = SVGP(z, mean_constant=0.3).double().cuda()
    cavi = CAVI(model, BernoulliLogitLikelihood().cuda(), num_data=len(y))
    data = cavi.check_data(x, y)
    cavi.step(data.take(slice(0, 20)))
    batch = data.take(slice(20, 40))
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            cavi.step(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # (the sync debug mode's own notice about its coverage is not a synchronisation)
    syncs = [w for w in caught if "called a synchronizing" in str(w.message)]
    assert len(syncs) <= 2, [str(w.message) for w in syncs]
