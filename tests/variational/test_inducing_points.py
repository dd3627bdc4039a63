"""Inducing-point initialisation: k-means++ (+ Lloyd) and greedy conditional-variance selection."""

from __future__ import annotations

import gpytorch
import pytest
import torch

import gpytorch_augment
from gpytorch_augment.variational import greedy_variance, kmeans_plus_plus


def _blobs(num_blobs: int = 6, per_blob: int = 50, dim: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    centres = 20 * torch.randn(num_blobs, dim, generator=g)
    x = (centres.unsqueeze(1) + 0.3 * torch.randn(num_blobs, per_blob, dim, generator=g)).reshape(-1, dim)
    return x, centres


def _inertia(x: torch.Tensor, centres: torch.Tensor) -> float:
    return float(torch.cdist(x, centres).pow(2).min(-1).values.sum())


def test_exported_from_the_package():
    assert gpytorch_augment.kmeans_plus_plus is kmeans_plus_plus
    assert gpytorch_augment.greedy_variance is greedy_variance


# ------------------------------------------------------------------------------------------------ k-means++
def test_kmeans_finds_well_separated_blobs():
    x, centres = _blobs()
    Z = kmeans_plus_plus(x, 6, generator=torch.Generator().manual_seed(1))
    assert Z.shape == (6, 3) and Z.dtype == x.dtype
    # one centre per blob, at its sample mean
    means = x.reshape(6, 50, 3).mean(1)
    dist = torch.cdist(means, Z)
    assert sorted(dist.argmin(-1).tolist()) == list(range(6))
    torch.testing.assert_close(dist.min(-1).values, torch.zeros(6), rtol=0, atol=1e-10)


def test_kmeans_seeding_returns_data_rows_and_lloyd_improves_it():
    x, _ = _blobs(num_blobs=4, per_blob=100, seed=3)
    x = x + 2 * torch.randn(x.shape, generator=torch.Generator().manual_seed(5))  # overlapping clusters
    seeds = kmeans_plus_plus(x, 12, generator=torch.Generator().manual_seed(0), num_iters=0)
    assert all(bool((x == z).all(-1).any()) for z in seeds)
    refined = kmeans_plus_plus(x, 12, generator=torch.Generator().manual_seed(0), num_iters=20)
    assert _inertia(x, refined) < _inertia(x, seeds)


def test_kmeans_is_reproducible_and_chunking_does_not_matter():
    x, _ = _blobs(seed=7)
    a = kmeans_plus_plus(x, 10, generator=torch.Generator().manual_seed(2))
    b = kmeans_plus_plus(x, 10, generator=torch.Generator().manual_seed(2), chunk_size=7)
    c = kmeans_plus_plus(x, 10, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert not torch.allclose(a, c)


def test_kmeans_with_as_many_centres_as_points_returns_the_points():
    x = torch.randn(8, 2, generator=torch.Generator().manual_seed(0))
    Z = kmeans_plus_plus(x, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(Z[torch.cdist(x, Z).argmin(-1)], x)


def test_kmeans_float32():
    x, _ = _blobs()
    Z = kmeans_plus_plus(x.float(), 6, generator=torch.Generator().manual_seed(1))
    assert Z.dtype == torch.float32 and torch.isfinite(Z).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_inducing": 0}, "num_inducing"),
        ({"num_inducing": 1000}, "num_inducing"),
        ({"num_inducing": 2.5}, "num_inducing"),
        ({"num_inducing": 3, "num_iters": -1}, "num_iters"),
        ({"num_inducing": 3, "chunk_size": 0}, "chunk_size"),
    ],
)
def test_kmeans_bad_arguments(kwargs, match):
    x, _ = _blobs()
    with pytest.raises(ValueError, match=match):
        kmeans_plus_plus(x, **kwargs)


@pytest.mark.parametrize("fn", ["kmeans", "greedy"])
@pytest.mark.parametrize(
    "x, match",
    [
        (torch.randn(5), "shape"),
        (torch.tensor([[0.0, float("nan")], [1.0, 2.0]]), "NaN"),
        (torch.ones(3, 2, dtype=torch.long), "floating"),
    ],
    ids=["1d", "nan", "integer"],
)
def test_bad_inputs(fn, x, match):
    with pytest.raises(ValueError, match=match):
        if fn == "kmeans":
            kmeans_plus_plus(x, 1)
        else:
            greedy_variance(x, 1, gpytorch.kernels.RBFKernel())


# ------------------------------------------------------------------------------------------------ greedy variance
def _naive_greedy(x: torch.Tensor, num_inducing: int, kernel) -> list[int]:
    """The algorithm exactly as written in the seed: argmax diag(K_XX - K_Xz K_zz^{-1} K_zX), explicit solves."""
    with torch.no_grad():
        K = kernel(x, x).to_dense()
    chosen = [int(K.diagonal().argmax())]
    while len(chosen) < num_inducing:
        Kxz, Kzz = K[:, chosen], K[chosen][:, chosen]
        residual = K.diagonal() - (Kxz * torch.linalg.solve(Kzz, Kxz.mT).mT).sum(-1)
        residual[chosen] = -1
        chosen.append(int(residual.argmax()))
    return chosen


def _nonstationary_kernel(dim: int):
    """Prior variances differ between points, so the greedy order has no ties."""
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5)) + gpytorch.kernels.LinearKernel()
    kernel.kernels[0].base_kernel.lengthscale = 0.8
    kernel.kernels[1].variance = 0.05
    return kernel


def test_greedy_variance_matches_the_naive_algorithm():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 2, generator=g)
    kernel = _nonstationary_kernel(2)
    Z, idx = greedy_variance(x, 15, kernel, return_indices=True)
    assert idx.tolist() == _naive_greedy(x, 15, kernel)
    assert torch.equal(Z, x[idx])
    # chunking does not change the result
    _, idx_chunked = greedy_variance(x, 15, kernel, chunk_size=11, return_indices=True)
    assert torch.equal(idx_chunked, idx)


def test_greedy_variance_shrinks_the_nystrom_residual_below_random_subsets():
    r"""The greedy rule drives down the largest conditional variance (far below any random subset's) and keeps the
    trace :math:`\mathrm{tr}(K_{XX} - Q_{XX})` that the sparse bound pays for below a typical random subset's."""
    g = torch.Generator().manual_seed(1)
    x = torch.cat([4 * torch.rand(300, 2, generator=g), 7 + 0.2 * torch.randn(20, 2, generator=g)])
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    kernel.base_kernel.lengthscale = 1.2

    def residual(Z):
        with torch.no_grad():
            Kxz = kernel(x, Z).to_dense()
            Kzz = kernel(Z, Z).to_dense() + 1e-8 * torch.eye(Z.shape[0])
            r = kernel(x, diag=True) - (Kxz * torch.linalg.solve(Kzz, Kxz.mT).mT).sum(-1)
            return float(r.sum()), float(r.max())

    Z = greedy_variance(x, 20, kernel, generator=torch.Generator().manual_seed(0))
    greedy_trace, greedy_max = residual(Z)
    randoms = [residual(x[torch.randperm(x.shape[0], generator=g)[:20]]) for _ in range(10)]
    assert greedy_max < 0.5 * min(r[1] for r in randoms)
    assert greedy_trace < sorted(r[0] for r in randoms)[len(randoms) // 2]
    # the small isolated cluster is covered
    assert bool((torch.cdist(Z, torch.tensor([[7.0, 7.0]])) < 1.0).any())


def test_greedy_variance_first_pick_tie_is_random_but_reproducible():
    x = torch.randn(50, 2, generator=torch.Generator().manual_seed(2))
    kernel = gpytorch.kernels.RBFKernel()  # stationary: every prior variance is 1
    a = greedy_variance(x, 5, kernel, generator=torch.Generator().manual_seed(0), return_indices=True)[1]
    b = greedy_variance(x, 5, kernel, generator=torch.Generator().manual_seed(0), return_indices=True)[1]
    firsts = {
        int(greedy_variance(x, 1, kernel, generator=torch.Generator().manual_seed(s), return_indices=True)[1])
        for s in range(8)
    }
    assert torch.equal(a, b) and len(set(a.tolist())) == 5
    assert len(firsts) > 1


def test_greedy_variance_takes_any_kernel_and_dtype():
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(3))
    for kernel in [
        gpytorch.kernels.PeriodicKernel(),
        gpytorch.kernels.RQKernel(),
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=3))
        * gpytorch.kernels.MaternKernel(nu=0.5),
    ]:
        Z, idx = greedy_variance(x, 8, kernel, return_indices=True)
        assert Z.shape == (8, 3) and len(set(idx.tolist())) == 8
    kernel32 = gpytorch.kernels.RBFKernel().float()
    Z = greedy_variance(x.float(), 8, kernel32)
    assert Z.dtype == torch.float32


def test_greedy_variance_stops_when_the_data_are_exhausted():
    x = torch.tensor([[0.0], [1.0], [2.0]]).repeat(10, 1)
    with pytest.warns(UserWarning, match="stopped after 3 of 5"):
        Z = greedy_variance(x, 5, gpytorch.kernels.RBFKernel())
    assert sorted(Z.squeeze(-1).tolist()) == [0.0, 1.0, 2.0]


def test_greedy_variance_threshold_and_candidates():
    x = torch.randn(200, 2, generator=torch.Generator().manual_seed(4))
    kernel = gpytorch.kernels.RBFKernel()
    kernel.lengthscale = 2.0
    Z = greedy_variance(x, 50, kernel, threshold=0.05)
    assert 2 < Z.shape[0] < 50
    _, idx = greedy_variance(
        x, 10, kernel, generator=torch.Generator().manual_seed(0), max_candidates=30, return_indices=True
    )
    again = greedy_variance(
        x, 10, kernel, generator=torch.Generator().manual_seed(0), max_candidates=30, return_indices=True
    )[1]
    assert torch.equal(idx, again) and len(set(idx.tolist())) == 10
    with pytest.raises(ValueError, match="max_candidates"):
        greedy_variance(x, 10, kernel, max_candidates=5)


def test_greedy_variance_rejects_batched_kernels():
    x = torch.randn(20, 2, generator=torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match="batch shape"):
        greedy_variance(x, 3, gpytorch.kernels.RBFKernel(batch_shape=torch.Size([2])))
