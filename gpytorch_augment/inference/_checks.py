"""Structure checks of :class:`~gpytorch_augment.CAVI`, run up front: the inputs' dimension against the inducing
inputs, the data against ``num_data`` (latents against the model's batch shape: ``_validation.check_latents``, shared
with the MLLs)."""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_finite, check_inputs_targets, fits_batch
from ..likelihoods.augmented_likelihood import AugmentedLikelihood
from ..variational import CAVIVariationalStrategy, UnwhitenedCAVIVariationalStrategy


def check_input_dim(x: Tensor, inducing_points: Tensor) -> None:
    """Raise ``ValueError`` unless ``x`` has the inducing inputs' dimension ``D``."""
    if x.dim() >= 2 and x.shape[-1] != inducing_points.shape[-1]:
        raise ValueError(
            f"x has shape {tuple(x.shape)}, i.e. input dimension D = {x.shape[-1]}, but the model's inducing inputs "
            f"have shape {tuple(inducing_points.shape)} (D = {inducing_points.shape[-1]}): pass x of shape (N, "
            f"{inducing_points.shape[-1]})"
        )


def check_batch_size(batch: int, num_data: int, where: str) -> None:
    """Raise ``ValueError`` if a batch holds more points than the whole data set (``num_data``)."""
    if batch > num_data:
        raise ValueError(
            f"{where} got a batch of {batch} data points but CAVI was built with num_data={num_data} (the size of "
            f"the whole data set, by which batch statistics are scaled): pass num_data={batch} if these are all the "
            "data"
        )


def check_full_batch(num_points: int, num_data: int, sharded: bool) -> None:
    """Raise ``ValueError`` if a full-batch fit's data do not hold ``num_data`` points (it would silently become a
    scaled stochastic fit)."""
    if num_points != num_data:
        what = f"the shards hold {num_points}" if sharded else f"x and y hold {num_points}"
        raise ValueError(
            f"a full-batch fit needs all the data, but {what} data points and CAVI was built with "
            f"num_data={num_data}: pass num_data={num_points}, or batch_size=... for a mini-batch fit"
        )


def check_model_inputs(
    strategy: CAVIVariationalStrategy | UnwhitenedCAVIVariationalStrategy,
    likelihood: AugmentedLikelihood,
    x: Tensor,
    y: Tensor,
) -> None:
    """Raise ``ValueError`` unless ``x, y`` are finite data of the batch shape, input dimension and dtype of the CAVI
    ``strategy``'s model (for a likelihood with linear observations: ``x`` of shape ``(N, D)`` and ``y`` one target
    per observation, ``(n,)``)."""
    inducing_points = strategy.inducing_points
    model_dtype = inducing_points.dtype
    if likelihood.linear_observations:
        check_finite("x", x)
        check_finite("y", y)
        if x.dim() != 2 or y.dim() != 1:
            raise ValueError(
                f"{type(likelihood).__name__} takes x of shape (N, D) and y of shape (n,) (one target per "
                f"observation); got x of shape {tuple(x.shape)} and y of shape {tuple(y.shape)}"
            )
        check_input_dim(x, inducing_points)
        if x.is_floating_point() and x.dtype != model_dtype:
            raise ValueError(f"x has dtype {x.dtype} but the model's parameters are {model_dtype}: convert one of them")
        return
    batch_shape = strategy._variational_distribution.batch_shape
    try:
        data_batch = torch.broadcast_shapes(x.shape[:-2], batch_shape) if x.dim() >= 2 else None
    except RuntimeError:
        data_batch = None
    check_inputs_targets(x, y, data_batch)
    check_input_dim(x, inducing_points)
    if x.is_floating_point() and x.dtype != model_dtype:
        raise ValueError(
            f"x has dtype {x.dtype} but the model's parameters are {model_dtype}: convert the model "
            f"(model.double() / model.float(), and the likelihood) or the data (x.to({model_dtype}), same for y)"
        )
    if not fits_batch(x.shape[:-2], batch_shape):
        raise ValueError(
            f"x has shape {tuple(x.shape)}, whose batch dimensions {tuple(x.shape[:-2])} do not fit the model's "
            f"batch shape {tuple(batch_shape)}: pass x of shape (N, D) or (*batch_shape, N, D)"
        )
