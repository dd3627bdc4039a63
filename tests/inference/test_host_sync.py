"""Host synchronisations in CAVI's loop: a step of ``CAVI.fit`` reads nothing back from the device but
its ELBO, except the kernel factorisation's failure check (GPyTorch's jitter retry) or, at a full-batch step, the
prior cache's one validity check.

On CPU there is no synchronisation to observe, so the tests count what would be one on CUDA: every conversion of a
tensor to a Python value (``bool``, ``float``, ``int``, ``item``, ``tolist``) made while the step runs. The value
checks of the data run once, at ``fit``'s entry (``CAVI.check_data``), and the steps take the checked value
(an ``ObservedData``): a step on checked data checks nothing."""

from __future__ import annotations

import collections
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from gpytorch_augment import CAVI, BernoulliLogitLikelihood
from gpytorch_augment._numerics import reverse_cholesky
from gpytorch_augment.core import NaturalParameters, PriorFactorizationError
from gpytorch_augment.testing import gp_data, make_cavi_model
from tests.likelihoods.registry import CASES

_READS = ("__bool__", "__float__", "__int__", "item", "tolist")


@contextmanager
def host_reads() -> Iterator[collections.Counter]:
    """Count the tensor-to-Python conversions made inside, by the innermost package or GPyTorch frame."""
    counts: collections.Counter = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in _READS}

    def counting(name: str):
        original = originals[name]

        def read(self, *args, **kwargs):
            stack = traceback.extract_stack()[:-1]
            frames = [f for f in stack if "gpytorch" in f.filename or "linear_operator" in f.filename]
            where = f"{frames[-1].filename.rsplit('/', 2)[-1]}:{frames[-1].lineno}" if frames else "?"
            counts[f"{name} at {where}"] += 1
            return original(self, *args, **kwargs)

        return read

    try:
        for name in _READS:
            setattr(torch.Tensor, name, counting(name))
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def _cavi(case, frozen_constants: bool = True, device: torch.device | str = "cpu"):
    """A CAVI driver and the data of ``case``, both on ``device``."""
    d = gp_data(case, n=60)
    d.x, d.y = d.x.to(device), d.y.to(device)
    d.kwargs = {k: v.to(device) for k, v in d.kwargs.items()}
    d.likelihood = d.likelihood.to(device)
    if frozen_constants:
        for p in d.likelihood.parameters():
            p.requires_grad_(False)
    z = torch.linspace(-3, 3, 8, dtype=torch.float64, device=device).unsqueeze(-1)
    return CAVI(make_cavi_model(case.num_latents, z).double().to(device), d.likelihood, num_data=60), d


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_minibatch_step_reads_back_only_the_kernel_factorisation_check(case, device):
    cavi, d = _cavi(case, device=device)
    data = cavi.check_data(d.x, d.y, d.kwargs)
    cavi.step(data.take(slice(0, 20)))  # schedules and caches settle
    with host_reads() as reads:
        cavi.step(data.take(slice(20, 40)))
    assert sum(reads.values()) <= 1, dict(reads)  # psd_safe_cholesky(K_ZZ) asks whether the factorisation failed


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_full_batch_step_reads_back_only_the_prior_cache_check(case, device):
    cavi, d = _cavi(case, device=device)
    data = cavi.check_data(d.x, d.y, d.kwargs)
    cavi.step(data)  # fills the prior cache
    with host_reads() as reads:
        cavi.step(data)
    assert sum(reads.values()) <= 1, dict(reads)  # one comparison of the cached inputs and parameters


def test_a_step_on_raw_tensors_checks_its_batch():
    case = next(c for c in CASES if c.name == "bernoulli_logit")
    cavi, d = _cavi(case)
    with host_reads() as reads:
        cavi.step(d.x, d.y)
    assert sum(reads.values()) > 1  # finite inputs, labels in {0, 1}
    with pytest.raises(ValueError, match="labels y"):
        cavi.step(d.x, torch.full_like(d.y, 2.0))
    with pytest.raises(TypeError, match="either checked data"):
        cavi.step(cavi.check_data(d.x, d.y), d.y)


def test_fit_checks_the_whole_data_once_before_the_first_step():
    case = next(c for c in CASES if c.name == "bernoulli_logit")
    cavi, d = _cavi(case)
    y = d.y.clone()
    y[-1] = 2.0  # in the last mini-batch only
    with pytest.raises(ValueError, match="labels y"):
        cavi.fit(d.x, y, batch_size=20, num_epochs=1)
    assert cavi.num_steps == 0


def test_the_checked_data_are_immutable():
    case = next(c for c in CASES if c.name == "bernoulli_logit")
    cavi, d = _cavi(case)
    data = cavi.check_data(d.x, d.y)
    with pytest.raises(AttributeError):
        data.y = d.y  # type: ignore[misc]
    with pytest.raises(TypeError):
        data.kwargs["trials"] = d.y  # type: ignore[index]


def test_the_unchecked_factorisation_turns_a_failure_into_nan_and_fit_reports_it():
    bad = NaturalParameters(torch.zeros(2, dtype=torch.float64), torch.tensor([[1.0, 2.0], [2.0, 1.0]]).double())
    assert torch.isnan(bad.factorize().C).all()
    B = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(reverse_cholesky(B, checked=False), reverse_cholesky(B))

    x = torch.linspace(-1, 1, 20, dtype=torch.float64).unsqueeze(-1)
    y = (x.squeeze(-1) > 0).double()
    model = make_cavi_model(1, x[::4].clone()).double()
    cavi = CAVI(model, BernoulliLogitLikelihood().double(), num_data=20)
    with torch.no_grad():
        model.variational_strategy._variational_distribution.variational_mean.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="augmented ELBO became nan"):
        cavi.fit(x, y, max_iter=3)
    with torch.no_grad():
        model.covar_module.raw_outputscale.fill_(float("nan"))
    with pytest.raises(PriorFactorizationError, match="NaN entries"):
        cavi.fit(x, y, max_iter=3)
