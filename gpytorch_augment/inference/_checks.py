"""Structure checks of :class:`~gpytorch_augment.CAVI`, run up front: the inputs' dimension against the inducing
inputs, the data against ``num_data`` (latents against the model's batch shape: ``_validation.check_latents``, shared
with the MLLs)."""

from __future__ import annotations

from torch import Tensor


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
