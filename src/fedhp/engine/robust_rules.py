"""Byzantine-robust aggregation rules over a round's rows (issue 20; their options:
:class:`fedhp.robust.RobustOptions`).

Every rule maps ``rows [n, P]`` (one row per client or edge: its model, or its update = model −
the model it started from) and ``weights [n]`` (positive) to one aggregate ``[P]``, vectorized over
the rows. Which rules use the weights:

* ``mean`` — the weighted mean ``Σ w_i x_i / Σ w_i`` (FedAvg's; the default), bit for bit
  :func:`fedhp.engine.ops.weighted_mean`;
* ``median`` — the coordinate-wise median, **unweighted**; for an even ``n`` the mean of the two
  middle values (not ``torch.median``'s lower median);
* ``trimmed_mean`` — per coordinate, drop the ``⌊βn⌋`` smallest and the ``⌊βn⌋`` largest values
  (trimming counts rows, not weight), the weighted mean of the rest;
* ``krum`` — the row with the lowest Krum score (Blanchard et al. 2017); unweighted;
* ``multi_krum`` — the weighted mean of the ``m`` rows with the lowest Krum scores;
* ``clip`` — each update ``x_i − reference`` scaled to norm ≤ S (never up), then the weighted
  mean, added back to ``reference``;
* ``cclip`` — centered clipping (Karimireddy, He and Jaggi, ICML 2021): ``L`` times
  ``v ← v + Σ w_i clip_τ(u_i − v) / Σ w_i`` from the ``centre`` ``v`` (the previous round's
  aggregate update; 0 in the first round), ``u_i = x_i − reference``; ``clip`` is its ``L = 1``
  case with the centre at 0 (the round's start model) and ``τ = S``;
* ``geomed`` — the weighted geometric median by the smoothed Weiszfeld algorithm (RFA, Pillutla,
  Kakade and Harchaoui, IEEE TSP 2022).

``reference [P]`` (optional) is what the rows' updates are measured from: ``clip`` and ``cclip``
need it (clipping models instead of updates is rarely what one wants), ``geomed`` works on the
updates for precision (it is translation-equivariant); the other rules are
translation-equivariant, so it changes their result by rounding only and they ignore it.

All rules hold the ``n`` rows at once (a round that uses one cannot be folded part by part, see
``docs/engine.md``, "Streamed rounds"); the rows must be finite. Ties: ``median`` and
``trimmed_mean`` do not depend on how equal values are ordered; ``krum`` picks the lowest row
index among equal scores and ``multi_krum`` keeps lower indices first.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from fedhp.engine.ops import weighted_mean
from fedhp.robust import RobustOptions

COLUMN_CHUNK = 2**22
"""Elements (rows × columns) sorted at once by the coordinate-wise rules: bounds the sort's
temporaries (values and int64 indices, 12 bytes an element) to ~50 MB whatever ``P`` is."""

TRIM_TOLERANCE = 1e-9
"""Added to ``β·n`` before the floor, so a β written in decimal trims what it says (0.29·100 is
28.999999999999996 in binary floating point; it trims 29)."""


def _check_shapes(
    rows: torch.Tensor, weights: torch.Tensor, reference: torch.Tensor | None = None
) -> None:
    """Raise ``ValueError`` unless ``rows [n, P]``, ``weights [n]`` (> 0), ``reference [P]``."""
    if rows.dim() != 2 or rows.shape[0] < 1:
        raise ValueError(f"rows must be [n, P] with n >= 1, got {tuple(rows.shape)}")
    if weights.shape != rows.shape[:1]:
        raise ValueError(f"weights must be [{rows.shape[0]}], got {tuple(weights.shape)}")
    if not bool((weights > 0).all()):
        raise ValueError("weights must be positive (leave rows of weight 0 out)")
    if reference is not None and reference.shape != rows.shape[1:]:
        raise ValueError(f"reference must be [{rows.shape[1]}], got {tuple(reference.shape)}")


def _by_columns(rule: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """``rule`` (a coordinate-wise map ``[n, p] → [p]``) applied to blocks of columns of at most
    :data:`COLUMN_CHUNK` elements, so its temporaries stay bounded."""
    n, p = rows.shape
    width = max(1, COLUMN_CHUNK // n)
    if width >= p:
        return rule(rows)
    out = torch.empty(p, dtype=rows.dtype, device=rows.device)
    for start in range(0, p, width):
        out[start : start + width] = rule(rows[:, start : start + width])
    return out


def mean(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The weighted mean ``Σ w_i x_i / Σ w_i`` → ``[P]`` (FedAvg's, bit for bit)."""
    _check_shapes(rows, weights)
    return weighted_mean(rows, weights)


def _median_block(rows: torch.Tensor) -> torch.Tensor:
    n = rows.shape[0]
    ordered = rows.sort(dim=0).values
    if n % 2:
        return ordered[n // 2]
    return 0.5 * ordered[n // 2 - 1] + 0.5 * ordered[n // 2]


def median(rows: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise median → ``[P]``, unweighted: the middle value of each column for an
    odd ``n``, the mean of the two middle values for an even ``n`` (``½a + ½b``, which cannot
    overflow). Costs a sort of each column, O(nP log n)."""
    if rows.dim() != 2 or rows.shape[0] < 1:
        raise ValueError(f"rows must be [n, P] with n >= 1, got {tuple(rows.shape)}")
    return _by_columns(_median_block, rows)


def trim_count(beta: float, n: int) -> int:
    """Rows dropped per side by the trimmed mean: ``⌊βn⌋`` (with :data:`TRIM_TOLERANCE`), at most
    ``(n − 1) // 2`` so at least one row is kept."""
    return min(math.floor(beta * n + TRIM_TOLERANCE), (n - 1) // 2)


def trimmed_mean(rows: torch.Tensor, weights: torch.Tensor, beta: float) -> torch.Tensor:
    """The coordinate-wise trimmed mean → ``[P]``: in each column drop the ``k = ⌊βn⌋`` smallest
    and the ``k`` largest values (:func:`trim_count`; counted in rows, whatever their weights),
    and take the weighted mean of the ``n − 2k`` kept values with their rows' weights. ``β = 0``
    is the weighted mean (up to summation order). Costs a sort of each column, O(nP log n)."""
    _check_shapes(rows, weights)
    n = rows.shape[0]
    k = trim_count(beta, n)
    w = weights.to(rows.dtype)

    def block(part: torch.Tensor) -> torch.Tensor:
        ordered, index = part.sort(dim=0)
        kept_w = w[index[k : n - k]]
        return (ordered[k : n - k] * kept_w).sum(0) / kept_w.sum(0)

    return _by_columns(block, rows)


def krum_scores(rows: torch.Tensor, f: int) -> torch.Tensor:
    """Krum scores ``[n]`` (Blanchard et al. 2017): for each row, the sum of its squared
    Euclidean distances to its ``n − f − 2`` nearest other rows. Needs ``n > 2f + 2``.

    Distances come from the Gram matrix of the rows centered on their mean
    (``‖a‖² + ‖b‖² − 2a·b``, clamped at 0; centering keeps the cancellation small), O(n²P)
    time and one ``[n, P]`` temporary."""
    n = rows.shape[0]
    if n <= 2 * f + 2:
        raise ValueError(f"Krum with f={f} needs more than {2 * f + 2} rows, got {n}")
    centered = rows - rows.mean(0)
    gram = centered @ centered.T
    sq_norms = gram.diagonal()
    dist = (sq_norms[:, None] + sq_norms[None, :] - 2 * gram).clamp_min(0)
    dist.fill_diagonal_(math.inf)
    return dist.topk(n - f - 2, dim=1, largest=False).values.sum(1)


def krum(rows: torch.Tensor, f: int) -> torch.Tensor:
    """Krum → ``[P]``: a copy of the row with the lowest :func:`krum_scores` (the lowest index
    among equal scores); unweighted."""
    return rows[int(torch.argmin(krum_scores(rows, f)))].clone()


def multi_krum(rows: torch.Tensor, weights: torch.Tensor, f: int, m: int) -> torch.Tensor:
    """Multi-Krum → ``[P]``: the weighted mean of the ``m`` rows with the lowest
    :func:`krum_scores` (scored once; equal scores keep lower indices first), their weights
    renormalized. ``m = n`` is :func:`mean` bit for bit; ``m = 1`` is :func:`krum`."""
    _check_shapes(rows, weights)
    n = rows.shape[0]
    if not 1 <= m <= n:
        raise ValueError(f"multi_krum keeps 1..{n} rows, got m={m}")
    order = torch.sort(krum_scores(rows, f), stable=True).indices
    keep = torch.zeros(n, dtype=torch.bool, device=rows.device)
    keep[order[:m]] = True
    return weighted_mean(rows, torch.where(keep, weights, torch.zeros_like(weights)))


def clip_scale(updates: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """The factors ``[n]`` that clip each row of ``updates [n, P]`` to norm ≤ S:
    ``S / ‖u_i‖`` where ``‖u_i‖ > S``, exactly 1 elsewhere (never above 1)."""
    norms = torch.linalg.vector_norm(updates, dim=1)
    return torch.where(norms > clip_norm, clip_norm / norms, torch.ones_like(norms))


def clip_updates(updates: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Each row of ``updates [n, P]`` times its :func:`clip_scale`: rows of norm ≤ S come back
    unchanged (bit for bit), no norm is ever raised, the others end at norm S up to rounding."""
    return updates * clip_scale(updates, clip_norm)[:, None]


def clipped_mean(
    rows: torch.Tensor,
    weights: torch.Tensor,
    clip_norm: float,
    reference: torch.Tensor | None = None,
) -> torch.Tensor:
    """Norm clipping → ``[P]``: ``reference + Σ w_i c_i (x_i − reference) / Σ w_i`` with the
    factors ``c_i`` of :func:`clip_scale` (the weighted mean of the clipped updates, the factors
    folded into the weights so no clipped copy is made); without ``reference`` the rows are taken
    to be updates and the result is their clipped mean. When no row is over S it is the weighted
    mean of the updates bit for bit. One ``[n, P]`` temporary (the updates) with a reference."""
    _check_shapes(rows, weights, reference)
    updates = rows if reference is None else rows - reference
    scale = clip_scale(updates, clip_norm)
    w = weights.to(rows.dtype)
    mean_update = ((w / w.sum()) * scale) @ updates
    return mean_update if reference is None else reference + mean_update


def centered_clip(
    rows: torch.Tensor,
    weights: torch.Tensor,
    tau: float,
    iterations: int,
    centre: torch.Tensor | None = None,
    reference: torch.Tensor | None = None,
) -> torch.Tensor:
    """Centered clipping → ``[P]`` (Karimireddy, He and Jaggi, ICML 2021, "Learning from History
    for Byzantine Robust Optimization"): from ``v = centre`` (an update ``[P]``; None: 0),
    ``iterations`` times ``v ← v + Σ w̄_i c_i (u_i − v)`` with ``w̄ = w / Σ w``, ``u_i = x_i −
    reference`` (the rows themselves without a reference) and ``c_i = min(1, τ/‖u_i − v‖)``
    (:func:`clip_scale`); returns ``reference + v``. With ``τ = ∞`` one iteration is the weighted
    mean (up to rounding); with ``centre = 0`` and one iteration it is :func:`clipped_mean` with
    ``S = τ``. One ``[n, P]`` temporary (``u − v``) per iteration, O(LnP)."""
    _check_shapes(rows, weights, reference)
    if centre is not None and centre.shape != rows.shape[1:]:
        raise ValueError(f"centre must be [{rows.shape[1]}], got {tuple(centre.shape)}")
    updates = rows if reference is None else rows - reference
    w = weights.to(rows.dtype)
    w = w / w.sum()
    v = torch.zeros_like(rows[0]) if centre is None else centre.to(rows.dtype).clone()
    for _ in range(iterations):
        diff = updates - v
        v = v + (w * clip_scale(diff, tau)) @ diff
    return v if reference is None else reference + v


def geometric_median(
    rows: torch.Tensor,
    weights: torch.Tensor,
    max_iter: int,
    nu: float,
    tol: float,
    reference: torch.Tensor | None = None,
) -> torch.Tensor:
    """The weighted geometric median → ``[P]``, ``argmin_z Σ α_i ‖z − x_i‖`` with ``α = w / Σ w``,
    by the smoothed Weiszfeld algorithm as in RFA (Pillutla, Kakade and Harchaoui, "Robust
    Aggregation for Federated Learning", IEEE TSP 2022): from the weighted mean ``z``, at most
    ``max_iter`` times ``β_i = α_i / max(ν, ‖z − x_i‖)``, ``z ← Σ β_i x_i / Σ β_i``, stopping once
    the objective falls by less than ``tol`` times itself. Works on the updates ``x_i −
    reference`` when a reference is given (float32 distances between whole models would lose
    digits) and adds it back. One ``[n, P]`` temporary per iteration, O(max_iter · nP)."""
    _check_shapes(rows, weights, reference)
    points = rows if reference is None else rows - reference
    alpha = weights.to(rows.dtype)
    alpha = alpha / alpha.sum()
    z = alpha @ points
    dist = torch.linalg.vector_norm(points - z, dim=1)
    objective = float(alpha @ dist)
    for _ in range(max_iter):
        beta = alpha / dist.clamp_min(nu)
        z = (beta / beta.sum()) @ points
        dist = torch.linalg.vector_norm(points - z, dim=1)
        previous, objective = objective, float(alpha @ dist)
        if abs(previous - objective) < tol * objective:
            break
    return z if reference is None else reference + z


def bucketed(
    rows: torch.Tensor, weights: torch.Tensor, size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """s-bucketing (Karimireddy, He and Jaggi, ICLR 2022): the rows in a random order (from
    ``generator``), cut into buckets of ``size`` (the last one smaller), each bucket's weighted
    mean with the bucket's total weight: ``(rows [⌈n/s⌉, P], weights [⌈n/s⌉])``."""
    n = rows.shape[0]
    order = torch.randperm(n, generator=generator, device=generator.device).to(rows.device)
    bucket_of = torch.empty(n, dtype=torch.long, device=rows.device)
    bucket_of[order] = torch.arange(n, device=rows.device) // size
    count = (n + size - 1) // size
    w = weights.to(rows.dtype)
    sums = torch.zeros(count, rows.shape[1], dtype=rows.dtype, device=rows.device)
    sums.index_add_(0, bucket_of, rows * w.unsqueeze(1))
    totals = torch.zeros(count, dtype=rows.dtype, device=rows.device).index_add_(0, bucket_of, w)
    return sums / totals.unsqueeze(1), totals


def aggregate(
    options: RobustOptions,
    rows: torch.Tensor,
    weights: torch.Tensor,
    reference: torch.Tensor | None = None,
    field: str = "robust",
    centre: torch.Tensor | None = None,
) -> torch.Tensor:
    """The aggregate ``[P]`` of ``rows [n, P]`` with ``weights [n]`` under ``options.name``;
    ``reference [P]`` is used by ``clip``, ``cclip`` and ``geomed`` (see the module docstring),
    ``centre [P]`` (an update; None: 0) by ``cclip`` only. Raises a one-line
    :class:`~fedhp.errors.ConfigError` naming ``field`` when the rule cannot take ``n`` rows
    (:meth:`RobustOptions.check`)."""
    _check_shapes(rows, weights, reference)
    n = rows.shape[0]
    options.check(n, field)
    if options.name == "mean":
        return weighted_mean(rows, weights)
    if options.name == "median":
        return median(rows)
    if options.name == "trimmed_mean":
        return trimmed_mean(rows, weights, options.beta)
    if options.name == "krum":
        return krum(rows, options.f)
    if options.name == "multi_krum":
        return multi_krum(rows, weights, options.f, options.keep(n))
    if options.name == "cclip":
        return centered_clip(rows, weights, options.tau, options.clip_iters, centre, reference)
    if options.name == "geomed":
        return geometric_median(rows, weights, options.max_iter, options.nu, options.tol, reference)
    assert options.clip_norm is not None  # the validator requires it for clip
    return clipped_mean(rows, weights, options.clip_norm, reference)
