r"""The registry of likelihoods that the shared protocol suite (``test_protocol.py``) runs against.

Every augmented likelihood registers **once**, here, and inherits every identity test of
``augmentations.md`` §12 (Ω and f full conditionals, deterministic marginalisation, Monte-Carlo checks of
the expectations, stationarity of :math:`q(\Omega)`, the two bounds, monotone CAVI, shapes and dtypes).

How a new likelihood registers
------------------------------
Write a ``cases_<family>.py`` module defining a :class:`~tests.likelihoods.case.LikelihoodCase` per
likelihood and add it to :data:`CASES` below::

    POISSON = LikelihoodCase(
            name="poisson",
            make=lambda: PoissonLikelihood(scale=3.0).double(),           # fresh, float64
            sample_targets=lambda f, g: torch.poisson(3.0 * torch.sigmoid(f), generator=g),
            marginalise=_marginalise_poisson,                              # no sampling; see below
            q_aux_distribution=lambda lik, y, q: AuxiliaryDistribution(...), # law of q*(Ω) for Monte Carlo
    )

The fields:

* ``make()`` returns a fresh likelihood in float64 (hyper-parameters set to non-default values where the
  likelihood has any, e.g. :math:`\theta\ne1`, non-integer :math:`r`, :math:`\nu\ne1`, :math:`\sigma\ne1`).
* ``sample_targets(f, generator, **kwargs)`` draws :math:`y \sim p(y\mid f)` from the model at the latent
  ``f`` (shape ``(N,)``, or ``(N, T)`` for ``T`` latents), using only ``generator`` for randomness.
* ``make_kwargs(shape, generator)`` (optional) returns the per-datum keyword data the entry points take
  (binomial ``trials``, Poisson ``exposure``…), tensors of the data shape ``(N,)``. They are passed to
  ``sample_targets``, to ``check_targets`` and to every public entry point (``expected_log_prob``,
  ``CAVI.step``, ``AugmentedELBO``…). The pure protocol members receive the canonical targets
  ``likelihood.check_targets(y, **kwargs)`` only.
* ``marginalise(likelihood, y, f)`` returns :math:`\log\int \text{tilt}\cdot p(\Omega\mid y)\,d\Omega`
  **without sampling** (§12 (c)), built from the likelihood's own pieces (``log_tilt``, ``aux_prior``) and an
  analytic integral over Ω: for Pólya-Gamma parts :math:`E_{\mathrm{PG}(b,0)} e^{-t\omega}=\cosh^{-b}\sqrt{t/2}`
  (:func:`log_pg_laplace`), for counts a truncated sum, for continuous auxiliaries adaptive quadrature
  (then set ``marginalise_atol=1e-7``).
* ``q_aux_distribution(likelihood, y, q_aux)`` returns the law of :math:`q^*(\Omega)` for the variational
  parameters ``q_aux`` as an :class:`~gpytorch_augment.distributions.auxiliary.AuxiliaryDistribution` whose
  ``sample()`` returns a dict shaped like the Gibbs draws (§12 (d) Monte Carlo; use an exact sampler).
* ``num_latents`` (``T``), ``f_bound`` (the test latents are drawn with :math:`|f|\le` ``f_bound``),
  tolerances, and ``skip``: a mapping from an identity letter of §12 (``"a"``…``"h"``) to the reason why it
  does not apply to this likelihood (e.g. ``{"b": "f is updated by a collapsed step, see §10.2"}``); use it
  sparingly, a skipped identity is an untested identity.
* ``expected_log_lik(likelihood, y, m, s)`` (optional) is the right-hand side of §12 (f),
  :math:`E_{\mathcal N(m,s)}\log p(y\mid f)` per datum. The default is 100-node Gauss--Hermite on
  ``likelihood.log_prob_at``, valid for one latent; multi-latent likelihoods must supply a product rule or a
  closed form (the default raises for them).
* ``extras``: optional hooks; ``extras["mc_expectations"](likelihood, y, q_aux, aux_draws)`` returns
  ``{name: (closed_form, per_draw_values)}`` for further §12 (d) comparisons (e.g. :math:`E\log\omega`).

Multi-latent likelihoods (``num_latents = T > 1``): latents are ``(N, T)``, potentials and precisions
``(T, N)``; auxiliaries with one value per latent are declared as ``Independent(..., 1)`` so that
``aux_prior(y).log_prob`` is one value per datum. ``tests/likelihoods/toy_multilatent.py`` is a complete
two-latent example (it runs with the suite as a self-test of these paths).

Nothing else changes: the tests in ``test_protocol.py`` are parametrised over :data:`CASES`.
"""

from __future__ import annotations

from tests.likelihoods.case import LikelihoodCase
from tests.likelihoods.cases_binary import BERNOULLI
from tests.likelihoods.cases_counts import COUNT_CASES
from tests.likelihoods.cases_robust import ROBUST_CASES
from tests.likelihoods.cases_heteroscedastic import HETEROSCEDASTIC_CASES
from tests.likelihoods.cases_multiclass import MULTICLASS_CASES

#: every registered likelihood; ``test_protocol.py`` (and the Gibbs Geweke test) are parametrised over it
CASES: list[LikelihoodCase] = [BERNOULLI, *COUNT_CASES, *ROBUST_CASES, *MULTICLASS_CASES, *HETEROSCEDASTIC_CASES]

__all__ = ["BERNOULLI", "CASES", "LikelihoodCase"]
