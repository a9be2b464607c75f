"""``sfedhp-table1``: the paper's Table I (global model of FedAvg, HierFAVG, FedProx, pFedMe and
sFedHP; pFedGP's personalized row, which has no global model) with the centralized
(budget-matched GM reference) and local-only (PM floor) reference rows, next to the paper's
numbers at the same hyperparameters; the trivial baseline (the majority class of the evaluated
test data) and the paper's orderings checked pair by pair on per-seed paired differences.
Writes ``table.md`` and ``table.json`` into the output folder."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError
from fedhp.experiments import paper
from fedhp.experiments.common import (
    ACC_KEYS,
    LABELS,
    Job,
    ReproOptions,
    markdown_table,
    mean_std,
    method_job,
    reproduce_table,
)
from fedhp.experiments.paper_rows import MODEL_WORDS, row_cells, row_header, table_page

NAME = "sfedhp-table1"
NOTE = (
    "GM: global model on the union of the clients' test sets; PM: each client's personalized "
    "model on its own test set (both micro-averaged). Final = last round, best = best "
    "evaluated round; mean ± standard error over seeds (sample std / √n; the mean alone for one "
    "seed; table.json has the std and every seed's value). The paper's numbers are at the SAME "
    "hyperparameters as our row: its Table I GM (mean ± std) where our λ / μ is Table I's, "
    "otherwise its Table II–VII GM at our λ (no std published), and '—' where the paper has "
    "no number at our μ (FedProx is reported at μ = 0.001 only). Paper PM is the Table II–VII "
    "entry at the same λ."
)
"""What the table's columns are and which of the paper's numbers stand beside ours."""
METHODS = ("fedavg", "hierfavg", "fedprox", "pfedme", "sfedhp", "pfedgp", "centralized", "local")
# Run only when ``--methods`` names them (not Table I methods; the default table is unchanged).
# Per-FedAvg (the paper's Table II PM row; η1 = 0.05): inner and meta steps α = β = 0.05.
EXTRA_METHODS = ("perfedavg",)
PERFEDAVG: dict[str, Any] = {"alpha": 0.05, "beta": 0.05}
TIE_SE = 2.0
"""A paired difference within ``TIE_SE`` standard errors of zero is a tie."""


def choose(opts: ReproOptions) -> dict[str, dict[str, Any]]:
    """Hyperparameters per method: ``--tuned`` values, else the paper's Table I choices."""
    tuned = opts.tuned_values()
    key = opts.key
    default: dict[str, dict[str, Any]] = {
        "fedprox": {"mu": 0.001},
        "pfedme": {"lam": paper.table1_lambda(key, "pfedme") if key in paper.TABLE1 else 15.0},
        "sfedhp": {"lam": paper.table1_lambda(key, "sfedhp") if key in paper.TABLE1 else 20.0},
    }
    out: dict[str, dict[str, Any]] = {}
    for method in METHODS:
        values = dict(default.get(method, {}))
        values.update(tuned.get(method, {}))
        out[method] = values
    return out


def jobs(opts: ReproOptions) -> list[Job]:
    params = choose(opts)
    methods = [m for m in METHODS if opts.methods is None or m in opts.methods]
    out = [method_job(m, **params[m]) for m in methods]
    if opts.methods is not None and "perfedavg" in opts.methods:
        out.append(method_job("perfedavg", **PERFEDAVG))
    return out


# ------------------------------------------------------------------------------ spread and pairs


def with_se(stat: Any) -> Any:
    """An aggregate entry (``mean``, ``std``, ``values``) with its standard error ``se`` = sample
    std / √n added (None for one seed: no spread measured); anything else as it is."""
    if not isinstance(stat, dict) or "std" not in stat:
        return stat
    n = len(stat.get("values", ()))
    se = stat["std"] / math.sqrt(n) if n >= 2 else None
    return {**stat, "se": se}


def pct_se(stat: Any) -> str:
    """``mean ± s.e.`` in percent (the mean alone for one seed; ``—`` when absent)."""
    if not isinstance(stat, dict):
        return "—"
    se = stat.get("se")
    if se is None:
        return f"{100 * stat['mean']:.2f}"
    return f"{100 * stat['mean']:.2f} ± {100 * se:.2f}"


def paired_difference(higher: Sequence[float], lower: Sequence[float]) -> dict[str, Any]:
    """The per-seed differences ``higher[s] − lower[s]`` (same seed, so the same data and
    minibatches), their mean and standard error (sample std / √n; None for one seed)."""
    if len(higher) != len(lower):
        raise ValueError(f"paired values of unequal length: {len(higher)} vs {len(lower)}")
    diffs = [a - b for a, b in zip(higher, lower, strict=True)]
    mean, std = mean_std(diffs)
    se = std / math.sqrt(len(diffs)) if len(diffs) >= 2 else None
    return {"diffs": diffs, "mean": mean, "se": se}


def verdict(mean: float, se: float | None, k: float = TIE_SE) -> str:
    """Whether the paper's ``higher > lower`` holds in our runs, from the paired mean difference
    ``higher − lower`` and its standard error: ``tie`` within ``k`` s.e. of zero, else ``holds``
    (positive) or ``reversed`` (negative); ``—`` without a standard error (one seed)."""
    if se is None or math.isnan(mean) or math.isnan(se):
        return "—"
    if abs(mean) <= k * se:
        return "tie"
    return "holds" if mean > 0 else "reversed"


def _seed_values(row: Mapping[str, Any], stat_key: str) -> list[float] | None:
    """A row's per-seed values of ``stat_key``, only where every seed has one (so seed s of one
    method pairs with seed s of another)."""
    stat = row.get(stat_key)
    if not isinstance(stat, dict):
        return None
    values = [float(v) for v in stat.get("values", ())]
    return values if values and len(values) == row.get("seeds") else None


def _paper_value(row: Mapping[str, Any], model: str) -> float | None:
    value = row.get("paper_gm") if model == "global" else row.get("paper_pm")
    if isinstance(value, list | tuple):
        return float(value[0]) if value else None
    return None if value is None else float(value)


def orderings(key: paper.Key, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The paper's orderings checked pair by pair: for the global model, every pair of Table I
    methods among ``rows``; for the personalized model, every pair of rows with a paper PM. The
    paper's side is its number at our row's hyperparameters (``paper_gm`` / ``paper_pm``); ours
    the per-seed paired difference (in points) of the final and of the best round, with its
    verdict (:func:`verdict`). A pair the paper ties, or one without per-seed values on both
    sides, is left out / gets ``—``."""
    out: list[dict[str, Any]] = []
    for model in ("global", "personal"):
        cands = [
            r
            for r in rows
            if _paper_value(r, model) is not None
            and (model == "personal" or r["method"] in paper.TABLE1_METHODS)
        ]
        cands.sort(key=lambda r: -(_paper_value(r, model) or 0.0))
        for i, hi in enumerate(cands):
            for lo in cands[i + 1 :]:
                p_hi, p_lo = _paper_value(hi, model), _paper_value(lo, model)
                assert p_hi is not None and p_lo is not None
                if p_hi == p_lo:
                    continue
                entry: dict[str, Any] = {
                    "model": model,
                    "higher": hi["method"],
                    "lower": lo["method"],
                    "higher_job": hi["job"],
                    "lower_job": lo["job"],
                    "paper": [p_hi, p_lo],
                    "paper_gap": p_hi - p_lo,
                    "text_disagrees": model == "global"
                    and paper.text_disagrees(key, hi["method"], lo["method"]),
                }
                for when in ("final", "best"):
                    stat_key = f"{when}_{model}_acc"
                    a, b = _seed_values(hi, stat_key), _seed_values(lo, stat_key)
                    if a is None or b is None or len(a) != len(b):
                        entry[when] = None
                        entry[f"{when}_verdict"] = "—"
                        continue
                    pair = paired_difference([100 * v for v in a], [100 * v for v in b])
                    entry[when] = pair
                    entry[f"{when}_verdict"] = verdict(pair["mean"], pair["se"])
                out.append(entry)
    return out


def _diff_cell(pair: Mapping[str, Any] | None) -> str:
    if pair is None:
        return "—"
    seeds = ", ".join(f"{d:+.2f}" for d in pair["diffs"])
    se = pair["se"]
    spread = "" if se is None else f" ± {se:.2f}"
    return f"{pair['mean']:+.2f}{spread} ({seeds})"


def orderings_markdown(checks: Sequence[Mapping[str, Any]]) -> str:
    """The orderings table (one line per pair) and what its verdicts mean."""
    header = [
        "model",
        "paper: higher > lower",
        "paper gap (points)",
        "ours final: Δ ± s.e. (per seed)",
        "final",
        "ours best: Δ ± s.e. (per seed)",
        "best",
    ]
    lines = []
    for c in checks:
        (p_hi, p_lo), hi, lo = c["paper"], LABELS[c["higher"]], LABELS[c["lower"]]
        pair = f"{hi} {p_hi:.2f} > {lo} {p_lo:.2f}"
        if c["text_disagrees"]:
            pair += " (text: the reverse)"
        lines.append(
            [
                MODEL_WORDS[c["model"]],
                pair,
                f"{c['paper_gap']:+.2f}",
                _diff_cell(c["final"]),
                c["final_verdict"],
                _diff_cell(c["best"]),
                c["best_verdict"],
            ]
        )
    note = (
        "Each of the paper's orderings, pair by pair: Δ = ours(higher) − ours(lower) in points, "
        "paired by seed (same seed: same data and minibatches), ± its standard error (std of the "
        f"per-seed differences / √n). **holds**: Δ > {TIE_SE:g} s.e.; **reversed**: "
        f"Δ < −{TIE_SE:g} s.e.; **tie**: within {TIE_SE:g} s.e. of zero; — : one seed (no "
        "s.e.) or a method not run. The paper's side: its number at our row's hyperparameters "
        "(Table I GM; Table II–V PM). '(text: the reverse)': the paper's text says the "
        "hierarchical methods outperform FedAvg, FedProx and pFedMe, its Table I does not."
    )
    if not lines:
        return f"## The paper's orderings\n\n{note}\n\n(no pair of methods with a paper number)\n"
    return f"## The paper's orderings\n\n{note}\n\n" + markdown_table(header, lines)


# ------------------------------------------------------------------------------ trivial baseline


def majority_shares(
    labels: Sequence[Any], num_classes: int
) -> tuple[float | None, float | None, int]:
    """From each client's evaluation labels (1-D integer tensors or arrays): the accuracy of
    predicting the majority class of their union (the trivial GM), of predicting each client's
    own majority class (the trivial PM, micro-averaged) and the number of samples; None where
    there are no samples."""
    import numpy as np

    counts = [np.bincount(np.asarray(y, dtype=np.int64), minlength=num_classes) for y in labels]
    total = int(sum(int(c.sum()) for c in counts))
    if total == 0:
        return None, None, 0
    union = np.sum(counts, axis=0)
    personal = sum(int(c.max()) for c in counts if c.sum() > 0)
    return int(union.max()) / total, personal / total, total


def trivial_options(opts: ReproOptions) -> list[str]:
    """The overrides of the data the table's runs evaluate on (seed 0; the partition's class
    counts do not depend on the seed): the shared ones and the user's, less those of a method."""
    extra = [e for e in opts.extra if not e.strip().startswith("algorithm.")]
    return [*opts.base_overrides(), "algorithm.name=fedavg", *extra, "seed=0"]


def trivial_baseline(opts: ReproOptions) -> dict[str, Any]:
    """The trivial baseline, computed from the data the runs evaluate on (loaded and partitioned
    as a run does; a dataset that cannot be had stops here, in one line, before any run):
    ``global``: always predict the majority class of the union of the clients' evaluation sets
    (the GM's test data); ``personal``: each client predicts its own majority class (the PM's);
    ``dataset_test``: the majority class of the dataset's whole test split."""
    from fedhp.build import partition_data
    from fedhp.config import resolve_config
    from fedhp.errors import DatasetError

    cfg = resolve_config(None, trivial_options(opts), refuse_unread=False)
    try:
        data, clients, _ = partition_data(cfg)
    except DatasetError as err:
        raise DatasetError(
            f"{NAME} --dataset {opts.dataset}: no run started: {err}".replace("\n", " ")
        ) from err
    split = cfg.eval_split
    labels = [c.val_y if split == "val" else c.test_y for c in clients]
    gm, pm, n = majority_shares(labels, data.num_classes)
    whole, _, n_whole = majority_shares([data.test_y], data.num_classes)
    return {"global": gm, "personal": pm, "samples": n, "split": split, "dataset_test": whole}


def trivial_markdown(trivial: Mapping[str, Any] | None) -> str:
    if not trivial:
        return ""
    whole = trivial.get("dataset_test")
    extra = f"; {100 * whole:.2f} % on the dataset's whole test split" if whole else ""
    return (
        f"Trivial baseline (from the data, seed 0's partition): predicting the majority class "
        f"of the {trivial['samples']:,} {trivial['split']} samples the GM is evaluated on gives "
        f"**{100 * trivial['global']:.2f} %**; each client predicting its own majority class "
        f"(the PM's data) **{100 * trivial['personal']:.2f} %**{extra}.\n"
    )


# ------------------------------------------------------------------------------------ the table


def build_table(
    opts: ReproOptions,
    results: dict[str, dict[str, Any]],
    trivial: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Rows of our table next to the paper's (JSON-ready), the orderings, the trivial baseline
    (where given: :func:`trivial_baseline`), plus the Markdown text."""
    key = opts.key
    rows: list[dict[str, Any]] = []
    for job_key, agg in results.items():
        method, params = agg["method"], agg["params"]
        lam = params.get("lam")
        rows.append(
            {
                "method": method,
                "label": LABELS[method],
                "params": params,
                "job": job_key,
                "gradient_evaluations_per_round": agg.get("gradient_evaluations_per_round"),
                **{k: with_se(agg.get(k)) for k in (*ACC_KEYS, "seconds")},
                "stopped": agg.get("stopped"),
                "seeds": agg.get("seeds"),
                "paper_gm": paper.table1_gm_at(key, method, params),
                "paper_pm": paper.paper_pm(key, method, lam),
            }
        )
    paper_titles = ("paper GM, same λ/μ (%)", "paper PM, same λ (%)")
    header = [
        *row_header("hyperparameters", ("global", "personal"), paper_titles),
        "time / seed (s)",
    ]
    lines = []
    for r in rows:
        hp = (
            ", ".join(
                f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["params"].items()
            )
            or "—"
        )
        sec = r["seconds"]
        paper_gm_pm = (r["paper_gm"], r["paper_pm"])
        lines.append(
            [
                *row_cells(r["label"], hp, r, ("global", "personal"), paper_gm_pm, cell=pct_se),
                f"{sec['mean']:.0f}" if isinstance(sec, dict) else "—",
            ]
        )
    if trivial:
        gm, pm = f"{100 * trivial['global']:.2f}", f"{100 * trivial['personal']:.2f}"
        lines.append(["Trivial (majority class)", "—", "0", gm, gm, pm, pm, "—", "—", "—"])
    title = f"sFedHP Table I reproduction — {opts.dataset} Setting {opts.setting}"
    checks = orderings(key, rows)
    table = table_page(opts, title, NOTE, header, lines, rows)
    text = table["markdown"]
    text += ("\n" + trivial_markdown(trivial)) if trivial else ""
    text += "\n" + orderings_markdown(checks)
    table.update(markdown=text, orderings=checks, trivial=dict(trivial) if trivial else None)
    return table


# ------------------------------------------------------------------- finished runs from a sweep


def seed_from_sweep(
    opts: ReproOptions, sweep_dir: Path, dry_run: bool = False
) -> list[tuple[Path, Path | None, str]]:
    """Copy the finished runs of a ``fedhp sweep`` folder (its sweep.json's runs, each folder
    with config.yaml and summary.json) into this reproduction's runs folder
    (``opts.runs_dir``), each to the ``<job>/seed<k>`` whose configuration it computed
    (:func:`fedhp.experiments.common.same_run`: cosmetic options such as ``checkpoint_every``
    and ``progress`` aside), so that the reproduction reuses them instead of running them again.
    A destination that already holds a run is left alone. Returns ``(source, destination or
    None, what happened)`` per run of the sweep."""
    import json
    import shutil

    from fedhp.config import config_to_dict, resolve_config
    from fedhp.experiments.common import job_tasks, same_run, saved_config

    manifest = sweep_dir / "sweep.json"
    if not manifest.is_file():
        raise ConfigError(f"{sweep_dir}: no sweep.json (not a `fedhp sweep` folder)")
    runs = json.loads(manifest.read_text()).get("runs", [])
    targets = [
        (folder, config_to_dict(resolve_config(None, overrides)))
        for _, _, overrides, folder in job_tasks(jobs(opts), opts, opts.runs_dir(NAME))
    ]
    out: list[tuple[Path, Path | None, str]] = []
    for run in runs:
        source = sweep_dir / run["out_dir"]
        saved = saved_config(source)
        if saved is None or not (source / "summary.json").is_file():
            out.append((source, None, "not finished here (no config.yaml + summary.json)"))
            continue
        dest = next((folder for folder, cfg in targets if same_run(saved, cfg)), None)
        if dest is None:
            out.append((source, None, "computes no run of this reproduction"))
        elif (dest / "config.yaml").exists() or (dest / "summary.json").exists():
            out.append((source, dest, "destination holds a run already; left alone"))
        else:
            if not dry_run:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(source, dest, dirs_exist_ok=True)
            out.append((source, dest, "would copy" if dry_run else "copied"))
    return out


def reproduce(opts: ReproOptions) -> dict[str, Any]:
    trivial = trivial_baseline(opts)  # (first: a dataset that cannot be had stops every run)

    def build(o: ReproOptions, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return build_table(o, results, trivial)

    return reproduce_table(opts, NAME, jobs, build)
