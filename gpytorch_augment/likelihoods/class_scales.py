r"""The logistic-softmax link's class scales :math:`\theta`: their exact maximiser given :math:`q(f)` (the closed-form
M-step of :class:`~gpytorch_augment.LogisticSoftmaxLikelihood`, or its MAP under a Gamma prior)."""

from __future__ import annotations

import numpy as np
import torch
from scipy import optimize
from torch import Tensor

__all__ = ["maximise_class_scales"]


def maximise_class_scales(
    a: Tensor,
    counts: Tensor,
    init: Tensor,
    prior: tuple[float, float] | None = None,
    max_iter: int = 100,
    tol: float = 1e-11,
) -> Tensor:
    r"""The class scales maximising :math:`F(\theta) = \sum_k (N_k + \alpha - 1)\log\theta_k - \sum_i \log\sum_k
    \theta_k a_{ik} - \beta\sum_k\theta_k` (:doc:`/maths/multiclass`; :math:`\alpha = 1, \beta = 0` without prior).

    :math:`F` is concave in :math:`\phi = \log\theta`, with gradient :math:`c_k - \sum_i w_{ik} - \beta\theta_k` and
    Hessian :math:`W^\top W - \mathrm{diag}(\sum_i w_{i\cdot} + \beta\theta)` (:math:`c_k = N_k + \alpha - 1`,
    :math:`w_{ik} = \theta_k a_{ik} / \sum_l \theta_l a_{il}`), negative definite once the gauge below is fixed; so
    the gradient has one root, the exact maximiser, found by ``scipy.optimize.root`` (Powell's hybrid method with
    the Hessian as Jacobian; a root of the gradient rather than a line search on :math:`F`, whose value cannot
    resolve the last digits of the maximiser). Without a prior :math:`F` is invariant under :math:`\theta \to
    c\theta`: the sum of :math:`\phi` is then held at its start by a quadratic penalty and the result normalised to
    mean 1. A class with :math:`c_k \le 0` (absent from the data, e.g. from a mini-batch) has its supremum at
    :math:`\theta_k \to 0`, which would make it unpredictable: it keeps its current value. Without a prior the
    classes present then have their supremum at infinity along :math:`\phi_P \to \phi_P + t` (scaling them up
    only shrinks the absent classes' share, which no datum opposes), so the sum of *their* :math:`\phi` is held at
    its start and only their ratios are maximised, and nothing is renormalised: every absent class keeps exactly
    its value, and a batch of a single class changes nothing (monotone steps; so is keeping the start, where the
    solver fails). The one-step formula :math:`\theta_k \leftarrow N_k / \sum_i a_{ik}/Q_i` (Galy-Fajou et al.,
    2020, *Multi-class Gaussian process classification made conjugate*) is the minorise-maximise step of the same
    objective.

    :param a: :math:`a_{ik} > 0`, shape ``(M, K)``.
    :param counts: :math:`N_k`, shape ``(K,)``.
    :param init: starting point (e.g. the current :math:`\theta`), shape ``(K,)``.
    :param prior: optional :math:`(\alpha, \beta)` of a :math:`\mathrm{Ga}(\alpha, \beta)` prior (MAP).
    :param max_iter: most gradient evaluations.
    :param tol: relative tolerance on :math:`\phi`.
    :returns: :math:`\theta`, shape ``(K,)``, float64 on the device of ``a``.

    Example::

        >>> import torch
        >>> from gpytorch_augment.likelihoods.class_scales import maximise_class_scales
        >>> a = torch.tensor([[1.0, 0.5], [0.2, 1.0], [0.7, 0.7]], dtype=torch.float64)
        >>> counts = torch.tensor([2.0, 1.0], dtype=torch.float64)
        >>> theta = maximise_class_scales(a, counts, init=torch.ones(2, dtype=torch.float64))
        >>> theta.shape, round(float(theta.mean()), 6)      # without a prior: normalised to mean 1
        (torch.Size([2]), 1.0)
    """
    a64, counts, init = (t.detach().to(device="cpu", dtype=torch.float64) for t in (a, counts, init))
    alpha, beta = (1.0, 0.0) if prior is None else (float(prior[0]), float(prior[1]))
    c = counts + alpha - 1
    free = c > 0
    log_a = a64.log()
    phi_all = init.clamp_min(torch.finfo(init.dtype).tiny).log()
    c_free, num_free = c[free], int(free.sum())
    all_free = num_free == len(c)
    gauge_sum = float(phi_all[free].sum()) if prior is None else None

    def full(p: Tensor) -> Tensor:
        out = phi_all.clone()
        out[free] = p
        return out

    def gradient(x: np.ndarray) -> np.ndarray:
        p = torch.from_numpy(x)
        w = torch.softmax(full(p) + log_a, -1)[:, free]
        grad = c_free - w.sum(0) - beta * p.exp()
        if gauge_sum is not None:  # hold sum(phi) at its start (F is flat along it, or unbounded: absent classes)
            if not all_free:  # the constrained maximiser: the gradient projected onto sum(phi) = const
                grad = grad - grad.mean()
            grad = grad - (p.sum() - gauge_sum) / num_free
        return grad.numpy()

    def hessian(x: np.ndarray) -> np.ndarray:
        p = torch.from_numpy(x)
        w = torch.softmax(full(p) + log_a, -1)[:, free]
        hessian = w.mT @ w - torch.diag(w.sum(0) + beta * p.exp())
        if gauge_sum is not None and not all_free:
            hessian = hessian - hessian.mean(0, keepdim=True)
        return (hessian - 1.0 / num_free if gauge_sum is not None else hessian).numpy()

    def objective(p: Tensor) -> float:
        return float((c_free * p).sum() - torch.logsumexp(full(p) + log_a, -1).sum() - beta * p.exp().sum())

    if num_free > (0 if prior is not None or all_free else 1):  # one present class alone: no ratio to fit
        start = phi_all[free]
        result = optimize.root(gradient, start.numpy(), jac=hessian, options={"xtol": tol, "maxfev": max_iter})
        root = torch.from_numpy(result.x)
        if np.isfinite(result.x).all() and objective(root) >= objective(start):  # else keep the start: monotone
            phi_all = full(root)
    theta = phi_all.exp().to(a.device)
    return theta / theta.mean() if prior is None and all_free else theta


# ---------------------------------------------------------------------------------------------- the likelihood
