"""Client-level differential privacy: DP-FedAvg (McMahan et al., ICLR 2018, "Learning
Differentially Private Recurrent Language Models") as standalone pieces, and its accounting.

The mechanism, at the aggregator that receives the clients' updates (the cloud, or each edge):

1. each client's update ``Δ_k`` (its model minus the model it started from) is clipped to L2 norm
   at most ``S``: ``Δ_k · min(1, S / ‖Δ_k‖)`` (:func:`clip_updates`);
2. the clipped updates are summed and Gaussian noise ``N(0, σ² S² I)`` is added to the sum
   (:func:`noised_sum`); one client changes the sum by at most ``S`` (add/remove one client) or
   ``2S`` (replace one client), so ``σ`` is the noise multiplier of a Gaussian mechanism;
3. the noised sum is divided by a denominator that does not depend on who took part
   (:func:`noised_mean`):

   - ``"poisson"`` sampling (each of the ``N`` clients takes part independently with probability
     ``q``): the *expected* number of participants ``q·N``. This is McMahan et al.'s
     fixed-denominator estimator ``f̃_f = Σ_k w_k Δ_k / (q W)`` with ``w_k = 1`` (``W = N``), the
     one their DP-FedAvg uses for its privacy analysis (its noise std on the average is
     ``z S / (q W)``, i.e. ``z S`` on the sum). Dividing by the realized count would reveal it,
     and the realized count is itself data about who took part.
   - ``"fixed"`` sampling (exactly ``m`` of the ``N`` clients, uniformly without replacement, the
     engine's ``sample_clients``): the sample size ``m``. This is what Flower's central-DP
     wrappers do: they add noise of std ``σ S / m`` to the average of the ``m`` sampled clients
     (``num_sampled_clients``), the same as ``σ S`` on the sum divided by ``m``.

Accounting (:class:`PrivacyAccountant`) uses the maintained ``dp-accounting`` library:

- ``"poisson"``: ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` under the add-or-remove-one
  neighbouring relation (sensitivity ``S``), with the RDP accountant (``RdpAccountant``, the
  subsampled-Gaussian analysis of Mironov et al. 2019, the same as Opacus's ``RDPAccountant``)
  or the PLD accountant (``PLDAccountant``, tighter);
- ``"fixed"``: ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(σ / 2))`` under the
  replace-one relation, RDP only (Wang, Balle & Kasiviswanathan 2019, Theorem 27;
  ``dp-accounting``'s PLD accountant has no event for sampling without replacement). Replacing one
  client moves the sum of clipped updates by up to ``2S``, so the Gaussian's multiplier relative
  to that sensitivity is ``σ S / (2S) = σ / 2``. (Accounting fixed-size sampling as if it were
  Poisson with ``q = m / N`` is a common approximation, not a guarantee; it is not done here.)

Disabled DP or ``S = ∞`` with ``σ = 0`` leaves every number bit for bit as plain summation:
:func:`clip_updates` returns its input as is and :func:`noised_sum` draws nothing.

The package, one job per module: :mod:`fedhp.privacy.options` (the ``privacy:`` section of the
configuration, torch-free), :mod:`fedhp.privacy.mechanism` (clip and noise, torch) and
:mod:`fedhp.privacy.accountant` (ε with ``dp-accounting``).
"""
