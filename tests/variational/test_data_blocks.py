"""Products over the data in blocks of points (``core.linalg.block_width``): the prior terms, the marginals and the
sufficient statistics computed block by block equal the one-piece results (values and gradients), for one latent
and for a batch of latents, whitened and unwhitened; a one-call fit gives the same model either way."""

from __future__ import annotations

import copy

import pytest
import torch

import gpytorch_augment.core.linalg as linalg
from gpytorch_augment import CAVI, BernoulliLogitLikelihood, CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy
from gpytorch_augment.core import SufficientStatistics, WhitenedGaussian
from gpytorch_augment.testing import make_cavi_model
from gpytorch_augment.testing.models import SVGP

N, M = 300, 7


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(N, 1, generator=g, dtype=torch.float64) * 6 - 3
    return x, torch.linspace(-3, 3, M, dtype=torch.float64).unsqueeze(-1)


def _blocks_of(monkeypatch: pytest.MonkeyPatch, points: int, rows: int) -> None:
    """Blocks of ``points`` data points for matrices of ``rows`` rows per point."""
    monkeypatch.setattr(linalg, "BLOCK_ELEMENTS", points * rows)


def test_block_width(monkeypatch):
    _blocks_of(monkeypatch, 64, 7)
    assert linalg.block_width(N, 7) == 64
    assert linalg.block_width(127, 7) == 127  # fewer than two blocks' worth: one piece


@pytest.mark.parametrize("num_latents", [1, 3])
@pytest.mark.parametrize("strategy_cls", [CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy])
def test_prior_terms_and_marginals_in_blocks_equal_one_piece(monkeypatch, strategy_cls, num_latents):
    x, z = _inputs()
    model = make_cavi_model(num_latents, z, strategy_cls=strategy_cls).double()
    strategy = getattr(model.variational_strategy, "base_variational_strategy", model.variational_strategy)
    params = [p for n, p in model.named_parameters() if "variational" not in n]
    g = torch.Generator().manual_seed(1)
    shape = (num_latents, M) if num_latents > 1 else (M,)
    q = WhitenedGaussian(torch.randn(shape, generator=g, dtype=torch.float64),
                         torch.eye(M, dtype=torch.float64) + 0.1 * torch.randn(*shape, M, generator=g,
                                                                                 dtype=torch.float64).tril())

    def evaluate():
        terms = strategy.cavi_terms(x, cache=False)
        mean, var = q.marginals(terms)
        loss = (mean.sin() * var).sum() + terms.a_sq.sum()
        return terms, (mean, var), torch.autograd.grad(loss, params)

    whole_terms, whole_marginals, whole_grads = evaluate()
    _blocks_of(monkeypatch, 64, M * num_latents)
    assert linalg.block_width(N, M * num_latents) == 64
    block_terms, block_marginals, block_grads = evaluate()
    for name, a, b in zip(whole_terms._fields, whole_terms, block_terms):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)
    for a, b in zip((*whole_marginals, *whole_grads), (*block_marginals, *block_grads)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chains", [(), (4,)])
def test_statistics_in_blocks_equal_one_piece(monkeypatch, chains):
    g = torch.Generator().manual_seed(2)
    A = torch.randn(2, M, N, generator=g, dtype=torch.float64)
    mu = torch.randn(2, N, generator=g, dtype=torch.float64)
    h = torch.randn(*chains, 2, N, generator=g, dtype=torch.float64)
    lam = torch.rand(*chains, 2, N, generator=g, dtype=torch.float64)
    whole = SufficientStatistics.from_batch(A, mu, h, lam)
    _blocks_of(monkeypatch, 50, M * 2 * (chains[0] if chains else 1))
    blocks = SufficientStatistics.from_batch(A, mu, h, lam)
    assert whole.precision.shape == (*chains, 2, M, M)
    torch.testing.assert_close(whole.precision, blocks.precision, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(whole.shift, blocks.shift, rtol=0, atol=0)


def test_one_call_fit_in_blocks_gives_the_same_model(monkeypatch):
    x, z = _inputs(3)
    y = torch.bernoulli(torch.sigmoid(2 * torch.sin(2 * x.squeeze(-1))), generator=torch.Generator().manual_seed(4))
    whole = SVGP(z).double()
    blocks = copy.deepcopy(whole)
    CAVI(whole, BernoulliLogitLikelihood(), num_data=N).fit(x, y, learn_hyperparameters=True)
    _blocks_of(monkeypatch, 64, M)
    CAVI(blocks, BernoulliLogitLikelihood(), num_data=N).fit(x, y, learn_hyperparameters=True)
    for (name, a), b in zip(whole.named_parameters(), blocks.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8, msg=name)
