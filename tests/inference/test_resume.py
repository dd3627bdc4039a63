"""Resumable fits: a mini-batch fit split by a checkpoint equals one run; max_iter stops warn."""

from __future__ import annotations

import pytest
import torch

from gpytorch_augment import CAVI, BernoulliLogitLikelihood, LogisticSoftmaxLikelihood, StudentTLikelihood
from tests.models import SVGP

N = 50


def _problem():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(N, 1, generator=g) * 6 - 3
    y = (torch.sin(2 * x.squeeze(-1)) + 0.3 * torch.randn(N, generator=g) > 0).double()
    return x, y, torch.linspace(-3, 3, 6).unsqueeze(-1)


def _cavi(z):
    return CAVI(SVGP(z), BernoulliLogitLikelihood(), num_data=N)


@pytest.mark.parametrize("split", [3, 5, 7])  # mid-epoch, at an epoch's end, in the second epoch
@pytest.mark.parametrize("seeded", [True, False])
@pytest.mark.filterwarnings("ignore:CAVI.fit stopped at max_iter")
def test_minibatch_fit_split_by_a_checkpoint_equals_one_run(tmp_path, split, seeded):
    x, y, z = _problem()

    def generator():
        return torch.Generator().manual_seed(11) if seeded else None

    torch.manual_seed(5)
    whole = _cavi(z)
    one = whole.fit(x, y, batch_size=10, max_iter=12, generator=generator())

    torch.manual_seed(5)
    first = _cavi(z)
    head = first.fit(x, y, batch_size=10, max_iter=split, generator=generator())
    first.save_checkpoint(tmp_path / "cavi.pt")
    torch.manual_seed(123)  # the global RNG moves on in between; the checkpoint restores what the shuffling needs
    second = _cavi(z)
    second.load_state_dict(torch.load(tmp_path / "cavi.pt", weights_only=True))
    tail = second.fit(x, y, batch_size=10, max_iter=12 - split, generator=torch.Generator() if seeded else None)

    assert head.elbo + tail.elbo == one.elbo
    for a, b in zip(whole.model.state_dict().values(), second.model.state_dict().values()):
        assert torch.equal(a, b)
    assert second.num_steps == whole.num_steps == 12


def test_fit_warns_and_reports_not_converged_at_max_iter():
    x, y, z = _problem()
    with pytest.warns(UserWarning, match="max_iter=2"):
        trace = _cavi(z).fit(x, y, max_iter=2)
    assert not trace.converged and trace.num_steps == 2


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda z: CAVI(SVGP(z[:4]), BernoulliLogitLikelihood(), num_data=N), r"inducing_points has shape \(6, 1\)"),
        (lambda z: CAVI(SVGP(z), StudentTLikelihood(), num_data=N), r"^state\['likelihood'\] does not fit.*lacks"),
        (lambda z: CAVI(_multitask(z, 3), LogisticSoftmaxLikelihood(3), num_data=N), r"^state\['model'\] does not"),
    ],
    ids=["other-M", "other-likelihood", "other-K"],
)
def test_a_checkpoint_of_another_model_raises_naming_the_part(make, message):
    """It raised torch's RuntimeError (or an IndexError inside GPyTorch) after part of the state was loaded."""
    torch.manual_seed(0)
    x, y, z = _problem()
    saved = _cavi(z)
    saved.fit(x, y, max_iter=2)
    target = make(z)
    before = [p.detach().clone() for p in target.model.parameters()]
    with pytest.raises(ValueError, match=message):
        target.load_state_dict(saved.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(before, target.model.parameters()))  # nothing was loaded


def _multitask(z, tasks):
    from gpytorch_augment.testing import make_cavi_model

    return make_cavi_model(tasks, z)
