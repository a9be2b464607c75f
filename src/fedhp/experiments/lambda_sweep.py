"""``sfedhp-lambda``: the paper's Tables II–VII — PM and GM of pFedMe and sFedHP over
λ ∈ {5, 15, 20, 25, 30}, HeurFedAMP PM for α ∈ {0.1, 0.5}, Per-FedAvg PM, and the GM-only rows
(FedAvg, HierFAVG, FedProx μ = 0.001), pFedGP PM, next to the paper's values, with the centralized
(GM reference) and local-only (PM floor) reference rows."""

from __future__ import annotations

from typing import Any

from fedhp.experiments import paper
from fedhp.experiments.common import LABELS, Job, ReproOptions, method_job, reproduce_table
from fedhp.experiments.paper_rows import row_cells, row_header, table_page

NAME = "sfedhp-lambda"
NOTE = (
    "PM: personalized models on their own clients' test sets; GM: the global model on all test "
    "sets. Final = last round, best = best evaluated round; mean ± sample std over seeds. pFedGP "
    "has no global model (no GM)."
)
"""What the table's columns are, under its title."""


def jobs(opts: ReproOptions) -> list[Job]:
    mu = opts.tuned_values().get("fedprox", {}).get("mu", 0.001)
    out = [method_job("fedavg"), method_job("hierfavg"), method_job("fedprox", mu=mu)]
    out += [method_job("heurfedamp", alpha=a) for a in paper.ALPHAS]
    out.append(method_job("perfedavg"))
    out.append(method_job("pfedgp"))
    out += [method_job("pfedme", lam=lam) for lam in paper.LAMBDAS]
    out += [method_job("sfedhp", lam=lam) for lam in paper.LAMBDAS]
    out += [method_job("centralized"), method_job("local")]
    if opts.methods is not None:
        out = [j for j in out if j.method in opts.methods]
    return out


def _paper(key: tuple[str, int], method: str, params: dict[str, Any]) -> tuple[Any, Any]:
    hp = params.get("lam", params.get("alpha"))
    pm = paper.paper_pm(key, method, hp)
    gm = paper.paper_gm(key, method, params.get("lam"))
    if method == "fedprox" and params.get("mu") != 0.001:
        gm = None
    return pm, gm


def build_table(opts: ReproOptions, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    key = opts.key
    rows: list[dict[str, Any]] = []
    lines: list[list[str]] = []
    for job_key, agg in results.items():
        method, params = agg["method"], agg["params"]
        pm, gm = _paper(key, method, params)
        row = {
            "method": method,
            "params": params,
            "job": job_key,
            "paper_pm": pm,
            "paper_gm": gm,
            **{
                k: agg.get(k)
                for k in (
                    "final_personal_acc",
                    "best_personal_acc",
                    "final_global_acc",
                    "best_global_acc",
                    "stopped",
                    "seeds",
                    "gradient_evaluations_per_round",
                )
            },
        }
        rows.append(row)
        hp = ", ".join(f"{k}={v:g}" for k, v in params.items()) or "—"
        lines.append(row_cells(LABELS[method], hp, row, ("personal", "global"), (pm, gm)))
    table_no = paper.TABLES.get(key, {}).get("table", "?")
    paper_titles = (f"paper PM, Table {table_no} (%)", f"paper GM, Table {table_no} (%)")
    header = row_header("λ / α / μ", ("personal", "global"), paper_titles)
    title = (
        f"sFedHP Table {table_no} reproduction (λ sweep) — {opts.dataset} Setting {opts.setting}"
    )
    return table_page(opts, title, NOTE, header, lines, rows)


def reproduce(opts: ReproOptions) -> dict[str, Any]:
    return reproduce_table(opts, NAME, jobs, build_table)
