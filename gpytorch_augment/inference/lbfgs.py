r"""The optimizers of the nested protocol: each runs L-BFGS iterations on a
:class:`~gpytorch_augment.inference.nested.NestedProtocol` and reports every iteration to the fit.

An optimizer is a callable ``run(protocol, on_iteration, max_iter) -> outcome``: after every iteration it has called
``protocol.after_iteration()`` and then ``on_iteration(value)`` with the objective per datum (a true ELBO, higher is
better); ``on_iteration`` returns ``True`` to stop. The outcome says why it stopped: ``"rule"`` (``on_iteration``
said so), ``"stalled"`` (the optimizer can make no further progress) or ``"cap"`` (``max_iter`` iterations).

* ``"torch"`` -- ``torch.optim.LBFGS`` one iteration at a time, with a strong-Wolfe line search
  (:meth:`NestedProtocol.step`; stalled after two iterations in a row that cannot move).
* ``"scipy"`` -- SciPy's L-BFGS-B (``scipy.optimize.minimize(method="L-BFGS-B")``) in float64 on the
  hyper-parameters' raw values, its own tolerances off so that the fit's rule decides; stalled where its line
  search fails or it reports convergence of its own.

Example::

    >>> import torch, gpytorch_augment as ga, gpytorch_augment.testing as gt
    >>> from gpytorch_augment.inference.hyperparameters import hyperparameters_of
    >>> from gpytorch_augment.inference.nested import NestedProtocol
    >>> x = torch.linspace(0, 6, 40, dtype=torch.float64).unsqueeze(-1)
    >>> y = (x.squeeze(-1).cos() > 0).double()
    >>> cavi = ga.CAVI(gt.SVGP(x[::5].clone()).double(), ga.BernoulliLogitLikelihood(), num_data=40)
    >>> values = []
    >>> outcome = OPTIMIZERS["scipy"](NestedProtocol(cavi, cavi.check_data(x, y), hyperparameters_of(cavi)),
    ...                               lambda v: values.append(v) or len(values) == 5, max_iter=50)
    >>> outcome, values[-1] > values[0]
    ('rule', True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["OPTIMIZERS", "run_scipy", "run_torch"]

OnIteration = Callable[[float], bool]


def run_torch(protocol: Any, on_iteration: OnIteration, max_iter: int) -> str:
    """``max_iter`` iterations of ``torch.optim.LBFGS`` at most (module docstring)."""
    for _ in range(max_iter):
        if on_iteration(protocol.step()):
            return "rule"
        if protocol.stalled:
            return "stalled"
    return "cap"


def run_scipy(protocol: Any, on_iteration: OnIteration, max_iter: int) -> str:
    """SciPy's L-BFGS-B for ``max_iter`` iterations at most (module docstring)."""
    from scipy.optimize import minimize

    params = protocol.params
    protocol.start()
    protocol.begin_iteration(None)
    sizes = [p.numel() for p in params]

    def write(theta: np.ndarray) -> None:
        with torch.no_grad():
            for p, chunk in zip(params, np.split(theta, np.cumsum(sizes)[:-1])):
                p.copy_(torch.as_tensor(chunk, dtype=torch.float64).reshape(p.shape).to(p))

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        write(theta)
        value, grads = protocol.evaluate()
        flat = torch.cat([g.reshape(-1).to(torch.float64) for g in grads]) if grads else torch.zeros(0, device="cpu")
        return value, flat.cpu().numpy()

    state = {"stop": False, "count": 0}

    def callback(intermediate_result: Any) -> None:
        write(intermediate_result.x)
        protocol.after_iteration()
        protocol.begin_iteration(float(intermediate_result.fun))
        state["count"] += 1
        if on_iteration(-float(intermediate_result.fun)):
            state["stop"] = True
            raise StopIteration

    start = torch.cat([p.detach().reshape(-1).to(torch.float64) for p in params]).cpu().numpy()
    result = minimize(
        fun, start, jac=True, method="L-BFGS-B", callback=callback,
        options={"maxiter": max_iter, "ftol": 0.0, "gtol": 0.0, "maxls": protocol.max_line_search, "maxcor": 20},
    )  # fmt: skip
    if not state["stop"]:
        write(result.x)
    if state["stop"]:
        return "rule"
    return "cap" if state["count"] >= max_iter else "stalled"


#: the nested protocol's optimizers by name
OPTIMIZERS: dict[str, Callable[[Any, OnIteration, int], str]] = {"torch": run_torch, "scipy": run_scipy}
