"""Stopping rules of ``CAVI.fit`` (``gpytorch_augment.inference.convergence``); the held-out rule inside a fit is
tested in ``test_stochastic_cavi.py``."""

from __future__ import annotations

import pytest

from gpytorch_augment import HeldOut, RelativeChange
from gpytorch_augment.inference.convergence import CAVITrace


def test_relative_change_over_a_window():
    rule = RelativeChange(tol=1e-3, window=2)
    trace = CAVITrace(elbo=[-1.0, -0.9, -0.5])
    assert not rule.check(trace, False)  # fewer than 2 windows
    trace.elbo.append(-0.5)
    assert not rule.check(trace, False)  # mean(-0.5, -0.5) vs mean(-1, -0.9)
    trace.elbo.extend([-0.5, -0.5004])
    assert rule.check(trace, False)  # |(-0.5 - 0.5004)/2 + 0.5| = 2e-4 <= 1e-3 * 1
    with pytest.raises(ValueError, match="window"):
        RelativeChange(window=0)
    with pytest.raises(ValueError, match="tol"):
        RelativeChange(tol=-1.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"window": 0}, "window"),
        ({"patience": 0}, "patience"),
        ({"every": 0}, "every"),
        ({"mode": "up"}, "mode"),
        ({"min_delta": -1.0}, "min_delta"),
    ],
)
def test_held_out_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HeldOut(lambda: 0.0, **kwargs)
