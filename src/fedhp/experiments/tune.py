"""``sfedhp-tune``: hyperparameter selection on VALIDATION data, never test data.

Every run uses the ``labels`` partition with ``val_per_class`` extra samples per class drawn from
training samples no client trains on, split among the clients with each client's label mix, and
evaluates on them (``eval_split=val``). Every method and grid point gets the same budget (rounds,
R·K = 100 gradient steps per client per round). Grids are the paper's: FedProx μ ∈ {0.001, 0.01,
0.1, 1}, pFedMe and sFedHP λ ∈ {5, 15, 20, 25, 30}, HeurFedAMP α ∈ {0.1, 0.5}; pFedGP's step
size lr ∈ {0.01, 0.05, 0.1} (ours: the paper tunes none for it).

Selection score: the FINAL-round validation accuracy (mean over seeds) — GM for FedProx, pFedMe
and sFedHP (Table I compares global models), PM for HeurFedAMP and pFedGP; a diverged run never
wins; ties go to the earlier grid value. The PM-optimal λ of pFedMe/sFedHP is recorded too. The
choices are merged into ``--tuned FILE`` (default ``OUT/tuned.json``) under the key
``<dataset>-s<setting>``; ``sfedhp-table1 --tuned FILE`` and ``sfedhp-lambda --tuned FILE`` use
them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from fedhp.experiments import paper
from fedhp.experiments.common import (
    Job,
    ReproOptions,
    inputs_text,
    markdown_table,
    method_job,
    run_jobs,
)
from fedhp.reporting import write_json_atomic

NAME = "sfedhp-tune"
VAL_PER_CLASS = {"mnist": 200, "fmnist": 200, "cifar10": 100}

PFEDGP_LRS = (0.01, 0.05, 0.1)  # around the authors' 0.05 (the sFedHP paper gives no grid)
# method -> (parameter, grid, metric the choice maximizes)
GRIDS: dict[str, tuple[str, tuple[float, ...], str]] = {
    "fedprox": ("mu", paper.FEDPROX_MUS, "global"),
    "pfedme": ("lam", paper.LAMBDAS, "global"),
    "sfedhp": ("lam", paper.LAMBDAS, "global"),
    "heurfedamp": ("alpha", paper.ALPHAS, "personal"),
    "pfedgp": ("lr", PFEDGP_LRS, "personal"),
}


def jobs(opts: ReproOptions) -> list[Job]:
    out = []
    for method, (param, grid, _) in GRIDS.items():
        if opts.methods is not None and method not in opts.methods:
            continue
        out += [method_job(method, None, None, **{param: v}) for v in grid]
    return out


def score(agg: dict[str, Any], metric: str) -> float | None:
    """Final-round validation accuracy; −inf for a diverged run, None where the method has no
    such model (e.g. FedProx's personalized accuracy)."""
    stat = agg.get(f"final_{metric}_acc")
    if agg.get("stopped"):
        return -math.inf
    if not isinstance(stat, dict):
        return None
    return float(stat["mean"]) if math.isfinite(stat["mean"]) else -math.inf


def select(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``choices`` (method -> {param: value}) and the full score table from run aggregates."""
    choices: dict[str, dict[str, float]] = {}
    scores: dict[str, list[dict[str, Any]]] = {}
    personal: dict[str, dict[str, float]] = {}
    for method, (param, grid, metric) in GRIDS.items():
        entries = [a for a in results.values() if a["method"] == method]
        if not entries:
            continue
        table = []
        for value in grid:
            agg = next((a for a in entries if a["params"].get(param) == value), None)
            if agg is None:
                continue
            table.append(
                {
                    param: value,
                    "score": score(agg, metric),
                    "personal": score(agg, "personal"),
                    "global": score(agg, "global"),
                }
            )
        scores[method] = table
        best = _argmax(table, lambda e: e["score"])
        if best is not None:
            choices[method] = {param: best[param]}
        if metric == "global":
            best_pm = _argmax(table, lambda e: e["personal"])
            if best_pm is not None:
                personal[method] = {param: best_pm[param]}
    return {"choices": choices, "personal_choices": personal, "scores": scores}


def _argmax(
    table: list[dict[str, Any]], key: Callable[[dict[str, Any]], float | None]
) -> dict[str, Any] | None:
    """The entry with the largest finite key (strict >: ties keep the earlier grid value)."""
    best, best_key = None, -math.inf
    for entry in table:
        value = key(entry)
        if value is not None and value > best_key:
            best, best_key = entry, value
    return best


SETTING_KEYS = ("rounds", "seeds", "model", "val_per_class", "criterion")


def merged(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` with the methods it did not tune kept from ``old`` (a ``--methods`` subset adds to
    the earlier choices), provided both were tuned under the same settings; otherwise ``new``."""
    if old is None or any(old.get(k) != new.get(k) for k in SETTING_KEYS):
        return new
    out = dict(new)
    for part in ("choices", "personal_choices", "scores"):
        out[part] = {**old.get(part, {}), **new.get(part, {})}
    return out


def _fmt(x: float | None) -> str:
    if x is None:
        return "—"
    return "diverged" if x == -math.inf else f"{100 * x:.2f}"


def reproduce(opts: ReproOptions) -> dict[str, Any]:
    out = opts.out_dir(NAME)
    val = VAL_PER_CLASS.get(opts.dataset, 100)
    opts.extra = [*opts.extra, f"partition.val_per_class={val}", "eval_split=val"]
    results = run_jobs(jobs(opts), opts, opts.runs_dir(NAME))
    chosen = select(results)
    entry = {
        "rounds": opts.rounds,
        "seeds": opts.seeds,
        "model": opts.model_name,
        "val_per_class": val,
        "criterion": "final-round validation accuracy",
        **chosen,
    }
    path = opts.tuned or out / "tuned.json"
    data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    key = f"{opts.dataset}-s{opts.setting}"
    data[key] = merged(data.get(key), entry)
    write_json_atomic(path, data)
    lines = []
    for method, table in chosen["scores"].items():
        param, _, metric = GRIDS[method]
        for e in table:
            mark = " ←" if chosen["choices"].get(method, {}).get(param) == e[param] else ""
            lines.append(
                [
                    method,
                    f"{param}={e[param]:g}",
                    metric,
                    _fmt(e["score"]) + mark,
                    _fmt(e["global"]),
                    _fmt(e["personal"]),
                ]
            )
    text = (
        f"# Validation tuning — {opts.dataset} Setting {opts.setting}, T = {opts.rounds}\n\n"
        f"{val} validation samples per class (unused training samples, each client's label "
        "mix). Score = final-round validation accuracy. "
        f"{inputs_text(opts.dataset, opts.extra)}\n\n"
        + markdown_table(
            ["method", "value", "metric", "score (%)", "val GM (%)", "val PM (%)"], lines
        )
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune.md").write_text(text)
    print(text)
    print(f"chosen: {json.dumps(chosen['choices'])} -> {path}")
    return entry
