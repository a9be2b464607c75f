"""``sfedhp-figures``: the paper's Figures 2–5 as PNG files.

* Fig. 2 — MLR (strongly convex): sFedHP (γ = 0) vs HierFAVG vs pFedMe, λ = 25: accuracy.
* Fig. 3 — DNN (non-convex): sFedHP sparse (γ1 = γ2 = 0.001 with the paper's schedule, whose
  switches need a θ density below 0.2 and round 100: in runs of ≤ 100 rounds the γ2 switch never
  fires) and non-sparse (γ = 0) vs HierFAVG vs pFedMe, λ = 25: accuracy, density (entries with
  |x| > ε) and the accumulated communication of ONE cloud-facing node — an edge server for
  sFedHP/HierFAVG, a client for pFedMe — in real wire bytes and in Remark 1 bits.
* Fig. 4 — effect of λ ∈ {5, 15, 20, 25, 30} on sparse sFedHP (γ1 = γ2 = 0.008, constant).
* Fig. 5 — effect of γ ∈ {0, 0.001, 0.004, 0.008} (constant, λ = 25).

Every run uses the zero threshold ε = ``comm.zero_threshold`` (default here 1e-4; override with
``comm.zero_threshold=...``): entries with |x| ≤ ε count as zero and are sent as zero.

The per-node curve is the link's accumulated total divided by its number of nodes (every node
takes part in every round in these runs); ``figures.json`` also gives node 0's exact total from
:meth:`fedhp.comm.CommLedger.node_totals` to check it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedhp.experiments import paper
from fedhp.experiments.common import (
    Job,
    ReproOptions,
    last_override,
    method_job,
    normalization_of,
    run_jobs,
)
from fedhp.reporting import plot_curves, read_rows, write_json_atomic

NAME = "sfedhp-figures"
EPS = 1e-4
LAM = 25.0
GAMMAS = (0.0, 0.001, 0.004, 0.008)
SPARSE = {"gamma1": 0.001, "gamma2": 0.001, "sparse_schedule": "true"}


def zero_threshold(opts: ReproOptions) -> float:
    """The ε the runs use: the last ``comm.zero_threshold=`` override, else :data:`EPS`."""
    return float(last_override(opts.extra, "comm.zero_threshold", repr(EPS)))


def _job(method: str, model: str, label: str, **params: Any) -> Job:
    job = method_job(method, **params)
    job.key = f"{model}-{job.key}"
    job.model = model
    job.overrides.append(f"comm.zero_threshold={EPS}")
    job.params = {"label": label, **params}
    return job


def jobs(opts: ReproOptions) -> dict[str, list[Job]]:
    dnn = opts.model if opts.model in ("dnn", "dnn-500-200") else "dnn"
    fig3 = [
        _job("sfedhp", dnn, "sFedHP sparse", lam=LAM, **SPARSE),
        _job("sfedhp", dnn, "sFedHP non-sparse", lam=LAM, gamma1=0.0, gamma2=0.0),
        _job("hierfavg", dnn, "HierFAVG"),
        _job("pfedme", dnn, "pFedMe", lam=LAM),
    ]
    return {
        "fig2": [
            _job("sfedhp", "mlr", "sFedHP", lam=LAM, gamma1=0.0, gamma2=0.0),
            _job("hierfavg", "mlr", "HierFAVG"),
            _job("pfedme", "mlr", "pFedMe", lam=LAM),
        ],
        "fig3": fig3,
        "fig4": [
            _job("sfedhp", dnn, f"λ={lam:g}", lam=lam, gamma1=0.008, gamma2=0.008)
            for lam in paper.LAMBDAS
        ],
        "fig5": [_job("sfedhp", dnn, f"γ={g:g}", lam=LAM, gamma1=g, gamma2=g) for g in GAMMAS],
    }


def read_metrics(folder: Path) -> list[dict[str, float]]:
    """metrics.csv of one run as floats (empty and non-numeric cells dropped)."""
    path = folder / "metrics.csv"
    if not path.is_file():
        return []
    return [
        {k: float(v) for k, v in row.items() if isinstance(v, int | float)}
        for row in read_rows(path)
    ]


def _series(rows: list[dict[str, float]], col: str, scale: float = 1.0) -> tuple[list[float], ...]:
    pts = [(r["round"], r[col] * scale) for r in rows if col in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def node_link(method: str) -> tuple[str, int]:
    """The cloud-facing link and its number of nodes for ``method``."""
    if method in ("sfedhp", "hierfavg"):
        return "edge_cloud", 4
    return "client_cloud", 20


def _curves(runs: list[tuple[Job, list[dict[str, float]]]], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for job, rows in runs:
        label = job.params["label"]
        link, nodes = node_link(job.method)
        if what == "acc":
            for col, tag in (("global_acc", "GM"), ("personal_acc", "PM")):
                xs, ys = _series(rows, col, 100.0)
                if xs:
                    out[f"{label} {tag}"] = (xs, ys)
        elif what == "density":
            for col, tag in (("density_global", "global"), ("density_personal", "client")):
                xs, ys = _series(rows, col)
                if xs:
                    out[f"{label} ({tag})"] = (xs, ys)
        elif what == "bytes":
            out[label] = _series(rows, f"cum_bytes_{link}", 1e-6 / nodes)
        elif what == "remark1":
            out[label] = _series(rows, f"cum_remark1_bits_{link}", 1e-6 / nodes)
    return out


PANELS = {
    "acc": ("test accuracy (%)", "accuracy"),
    "density": ("density (fraction |x| > ε)", "density"),
    "bytes": ("accumulated MB per cloud-facing node (real encoding)", "comm_bytes"),
    "remark1": ("accumulated Mbit per cloud-facing node (Remark 1)", "comm_remark1"),
}
FIG_PANELS = {
    "fig2": ("acc", "bytes"),
    "fig3": ("acc", "density", "bytes", "remark1"),
    "fig4": ("acc", "density"),
    "fig5": ("acc", "density", "remark1"),
}
TITLES = {
    "fig2": "Fig. 2: MLR (strongly convex), λ=25",
    "fig3": "Fig. 3: DNN (non-convex), λ=25",
    "fig4": "Fig. 4: effect of λ (γ1=γ2=0.008)",
    "fig5": "Fig. 5: effect of γ (λ=25)",
}


def _final(job: Job, rows: list[dict[str, float]], folder: Path) -> dict[str, Any]:
    last = rows[-1] if rows else {}
    link, nodes = node_link(job.method)
    entry: dict[str, Any] = {"label": job.params["label"], "method": job.method, "job": job.key}
    for col in ("global_acc", "personal_acc", "density_global", "density_personal"):
        if col in last:
            entry[f"final_{col}"] = last[col]
    entry["node_bytes_avg"] = last.get(f"cum_bytes_{link}", 0.0) / nodes
    entry["node_remark1_bits_avg"] = last.get(f"cum_remark1_bits_{link}", 0.0) / nodes
    nodes_path = folder / "nodes.json"
    if nodes_path.is_file():
        node0 = json.loads(nodes_path.read_text()).get(link, {}).get("0", {})
        entry["node0_bytes"] = node0.get("bytes")
        entry["node0_remark1_bits"] = node0.get("remark1_bits")
    return entry


def reproduce(opts: ReproOptions) -> dict[str, Any]:
    out = opts.out_dir(NAME)
    wanted = opts.methods  # here: a subset of fig2..fig5
    all_jobs = jobs(opts)
    runs_dir = opts.runs_dir(NAME)
    report: dict[str, Any] = {
        "zero_threshold": zero_threshold(opts),
        "rounds": opts.rounds,
        "normalize": normalization_of(opts.dataset, opts.extra),
        "figures": {},
    }
    sub = ReproOptions(**{**opts.__dict__, "methods": None})
    for fig, fig_jobs in all_jobs.items():
        if wanted is not None and fig not in wanted:
            continue
        results = run_jobs(fig_jobs, sub, runs_dir)
        runs, finals = [], []
        for job in fig_jobs:
            folder = Path(results[job.key]["folders"][0])
            rows = read_metrics(folder)
            runs.append((job, rows))
            finals.append(_final(job, rows, folder))
        files = []
        for panel in FIG_PANELS[fig]:
            ylabel, stem = PANELS[panel]
            path = out / f"{fig}_{stem}.png"
            plot_curves(
                _curves(runs, panel),
                path,
                "global round",
                ylabel,
                f"{TITLES[fig]} — {opts.dataset} S{opts.setting}",
            )
            files.append(str(path))
        report["figures"][fig] = {"files": files, "runs": finals}
        print(f"{fig}: {', '.join(files)}")
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "figures.json", report)
    return report
