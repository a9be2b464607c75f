"""``leaf-shakespeare``: the FedProx paper's Shakespeare experiment (LEAF's data, the 2-layer
character LSTM) for FedAvg and FedProx, plus pFedMe, sFedHP, Ditto, FedPer and FedLPS on the same
clients and rounds (new rows nobody has published).

The paper's setting (its README, ``run_fedavg.sh`` / ``plot_final_e20.py`` and appendix):
LEAF ``-s niid --sf 0.2 -k 0 --tf 0.8 -t sample``, 10 clients per round, E = 20 local epochs of
batch 10, SGD lr 0.8, 40 rounds, μ = 0.001 for FedProx, the model embedding 8 → LSTM 256 →
LSTM 256 → linear, sample-weighted aggregation, accuracy of the global model on the union of the
clients' test windows. Every method gets the same local work: FedAvg's epochs where the method
takes ``local_epochs``; pFedMe and sFedHP (R local rounds of K = 5 steps) the same number of
minibatch steps as FedAvg's mean client. sFedHP's edges are consecutive groups of about 10
clients (the clients are in play order, so an edge holds a few plays), one edge per round.

``--quick`` shrinks it to fit a CPU (the table says so): ``--sf 0.02`` (17 roles), 40-character
windows, LSTM 32, 20 local steps instead of 20 epochs, 30 rounds, class-stratified subsets of
15,000 training and 3,000 test windows (the roles' own windows, split by position as always),
evaluation every 5 rounds.

One printed line per method: ``leaf shakespeare <method> acc=<f> rounds=<n> time_s=<f>`` (acc:
the final round's accuracy, the global model's on the union of the test windows for FedAvg and
FedProx, the personalized models' on each role's own test windows for the other rows; mean over
seeds); ``table.md`` / ``table.json`` and ``acc.png`` in the output folder.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError
from fedhp.experiments.common import ReproOptions, markdown_table, mean_std, run_method_seeds
from fedhp.experiments.figures import read_metrics
from fedhp.reporting import plot_curves, write_json_atomic

METHODS = ("fedavg", "fedprox", "pfedme", "sfedhp", "ditto", "fedper", "fedlps")
GLOBAL_ROWS = ("fedavg", "fedprox")
"""Rows scored by the global model (the paper's metric); the others by their personal models."""
LABELS = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx (μ = 0.001)",
    "pfedme": "pFedMe",
    "sfedhp": "sFedHP",
    "ditto": "Ditto",
    "fedper": "FedPer",
    "fedlps": "FedLPS",
}
PAPER_NOTE = (
    "The FedProx paper shows Shakespeare only as curves (test accuracy vs round, its Fig. 1 / "
    "appendix); no value was read off them here, so the paper column is empty."
)
K_STEPS = 5
"""pFedMe's and sFedHP's steps per local round (K)."""


@dataclass(frozen=True)
class Scale:
    """One size of the experiment."""

    sample_fraction: float
    seq_len: int
    hidden: int
    rounds: int
    local_epochs: int | None
    local_steps: int | None
    lr: float
    batch: int
    per_round: int
    eval_every: int
    test_windows: int | None
    train_windows: int | None = None

    def text(self) -> str:
        local = (
            f"{self.local_epochs} local epochs"
            if self.local_epochs is not None
            else f"{self.local_steps} local steps"
        )
        test = "all test" if self.test_windows is None else f"{self.test_windows:,} test"
        if self.train_windows is not None:
            test = f"{self.train_windows:,} training and {test}"
        return (
            f"LEAF --sf {self.sample_fraction} -k 0 --tf 0.8 -t sample, seq_len {self.seq_len}, "
            f"LSTM embed 8 → 2 × {self.hidden}, {self.per_round} clients per round, {local} of "
            f"batch {self.batch}, SGD lr {self.lr}, {self.rounds} rounds, evaluated every "
            f"{self.eval_every} rounds ({test} windows, class-stratified subsets)"
        )


PAPER_SCALE = Scale(0.2, 80, 256, 40, 20, None, 0.8, 10, 10, 1, None)
QUICK_SCALE = Scale(0.02, 40, 32, 30, None, 20, 0.8, 10, 10, 5, 3000, 15000)


def scale_of(opts: ReproOptions) -> Scale:
    """The paper's scale, or ``--quick``; ``--rounds`` overrides the rounds."""
    scale = QUICK_SCALE if opts.quick else PAPER_SCALE
    return replace(scale, rounds=opts.rounds) if opts.rounds_given else scale


def dataset_overrides(scale: Scale, data_dir: str | None) -> list[str]:
    out = [
        "dataset.name=shakespeare",
        f"dataset.sample_fraction={scale.sample_fraction}",
        "dataset.min_samples=0",
        "dataset.train_fraction=0.8",
        f"dataset.seq_len={scale.seq_len}",
    ]
    return out + ([f"dataset.data_dir={data_dir}"] if data_dir else [])


@dataclass(frozen=True)
class Federation:
    """The clients the dataset yields at this scale."""

    clients: int
    mean_steps_per_epoch: float  # mean over clients of ceil(training windows / batch)

    @property
    def edges(self) -> int:
        return max(1, round(self.clients / 10))


def federation_of(scale: Scale, data_dir: str | None) -> Federation:
    """Count the clients (the parse is cached, so this is quick)."""
    import torch

    from fedhp.data.shakespeare import ShakespeareSource

    data = ShakespeareSource(
        data_dir=data_dir,
        sample_fraction=scale.sample_fraction,
        seq_len=scale.seq_len,
        train_fraction=0.8,
    ).load()
    assert data.train_owner is not None
    counts = torch.bincount(data.train_owner).double()
    return Federation(int(counts.numel()), float(torch.ceil(counts / scale.batch).mean()))


def local_steps(scale: Scale, fed: Federation) -> int:
    """Minibatch steps per round of a mean client (FedAvg's budget)."""
    if scale.local_steps is not None:
        return scale.local_steps
    assert scale.local_epochs is not None
    return max(1, round(scale.local_epochs * fed.mean_steps_per_epoch))


def method_overrides(method: str, scale: Scale, fed: Federation) -> list[str]:
    """``algorithm.*`` of one row (every row: lr, batch and the same local work)."""
    if method not in METHODS:
        raise ConfigError(f"--methods: unknown {method!r}; choose from {', '.join(METHODS)}")
    work = (
        [f"algorithm.local_epochs={scale.local_epochs}"]
        if scale.local_epochs is not None
        else [f"algorithm.local_steps={scale.local_steps}"]
    )
    name, batch = f"algorithm.name={method}", f"algorithm.batch_size={scale.batch}"
    common = [name, batch, f"algorithm.lr={scale.lr}"]
    if method == "fedprox":
        return [*common, *work, "algorithm.mu=0.001"]
    if method in ("pfedme", "sfedhp"):
        # θ steps of personal_lr (pFedMe) / lr (sFedHP) with λ = 1: lr·λ < 1 keeps them stable
        rounds = max(1, round(local_steps(scale, fed) / K_STEPS))
        loop = [f"algorithm.K={K_STEPS}", f"algorithm.R={rounds}", "algorithm.lam=1.0"]
        if method == "pfedme":
            return [*common, *loop, "algorithm.personal_lr=0.5"]
        return [name, batch, "algorithm.lr=0.5", f"algorithm.global_lr={scale.lr}", *loop]
    if method == "fedlps":
        return [*common, *work, f"algorithm.rounds={scale.rounds}"]
    return [*common, *work]  # fedavg, ditto, fedper


def run_overrides(
    opts: ReproOptions, method: str, seed: int, scale: Scale, fed: Federation
) -> list[str]:
    """Every override of one run."""
    return [
        *dataset_overrides(scale, opts.data_dir),
        *([f"subsample.test={scale.test_windows}"] if scale.test_windows else []),
        *([f"subsample.train={scale.train_windows}"] if scale.train_windows else []),
        "partition.name=natural",
        f"federation.num_clients={fed.clients}",
        f"federation.num_edges={fed.edges}",
        "federation.edges_per_round=1",
        f"federation.client_fraction={min(1.0, scale.per_round / fed.clients)}",
        "federation.weighting=samples",
        "model.name=lstm",
        "model.embed_dim=8",
        f"model.hidden={scale.hidden}",
        "model.layers=2",
        *method_overrides(method, scale, fed),
        f"rounds={scale.rounds}",
        f"eval_every={scale.eval_every}",
        "eval_train=false",
        f"threads={opts.threads}",
        "progress=false",
        "checkpoint_every=10",
        f"seed={seed}",
        *opts.extra,
    ]


def curve(folder: Path, method: str) -> list[tuple[float, float]]:
    """(round, the row's accuracy) at every evaluated round."""
    key = "global_acc" if method in GLOBAL_ROWS else "personal_acc"
    return [(r["round"], r[key]) for r in read_metrics(folder) if key in r]


def _stat(values: list[float]) -> dict[str, float]:
    m, sd = mean_std(values)
    return {"mean": m, "std": sd}


def row_of(method: str, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row: the row's accuracy (final, best), global and personal, time."""

    def get(key: str) -> dict[str, float]:
        return _stat([float(s.get(key, math.nan)) for s in summaries])

    main = "global_acc" if method in GLOBAL_ROWS else "personal_acc"
    flops = [s.get("train_flops") for s in summaries]
    return {
        "method": method,
        "label": LABELS[method],
        "metric": main,
        "acc": get(f"final_{main}"),
        "best_acc": get(f"best_{main}"),
        "global_acc": get("final_global_acc"),
        "personal_acc": get("final_personal_acc"),
        "rounds": int(summaries[0].get("rounds", 0)),
        "seconds": get("seconds"),
        "train_flops": None if None in flops else _stat([float(f) for f in flops]),  # type: ignore[arg-type]
        "paper_acc": None,
        "stopped": [s["stopped"] for s in summaries if s.get("stopped")],
        "folders": [s["folder"] for s in summaries],
    }


def _cell(stat: dict[str, float] | None, fmt: str = ".4f") -> str:
    if stat is None or math.isnan(stat["mean"]):
        return "—"
    text = format(stat["mean"], fmt)
    return text if stat["std"] == 0 or math.isnan(stat["std"]) else f"{text} ± {stat['std']:{fmt}}"


def markdown(rows: list[dict[str, Any]]) -> str:
    header = [
        "method",
        "acc (final)",
        "acc (best)",
        "scored by",
        "global acc (final)",
        "personal acc (final)",
        "paper acc",
        "rounds",
        "training FLOPs",
        "wall s",
    ]
    body = [
        [
            r["label"],
            _cell(r["acc"]),
            _cell(r["best_acc"]),
            "global model, union of test windows"
            if r["metric"] == "global_acc"
            else "own personal model, own test windows",
            _cell(r["global_acc"]),
            _cell(r["personal_acc"]),
            "—",
            str(r["rounds"]),
            _cell(r["train_flops"], ".3g"),
            _cell(r["seconds"], ".0f"),
        ]
        for r in rows
    ]
    return markdown_table(header, body)


def describe(opts: ReproOptions, scale: Scale, fed: Federation) -> str:
    import torch

    size = "QUICK CPU VERSION (not the paper's scale): " if opts.quick else "The paper's scale: "
    return (
        f"{size}{scale.text()}; {fed.clients} clients (roles), sample-weighted aggregation; "
        f"pFedMe / sFedHP: R = {max(1, round(local_steps(scale, fed) / K_STEPS))} × K = "
        f"{K_STEPS} steps, λ = 1 (pFedMe personal_lr 0.5; sFedHP θ lr 0.5, edge lr "
        f"{scale.lr}, {fed.edges} edges of consecutive clients, 1 per round); FedProx μ = 0.001; "
        f"Ditto λ = 0.1; FedPer: output layer personal; FedLPS: defaults (unit masks on the LSTM "
        f"hidden units, P-UCBV ratios). Seeds 0..{opts.seeds - 1}; torch threads = "
        f"{opts.threads}, {opts.jobs} run(s) at once (machine: {os.cpu_count()} CPUs, torch "
        f"{torch.__version__}). {PAPER_NOTE}"
    )


def reproduce(opts: ReproOptions, scale: Scale | None = None) -> dict[str, Any]:
    """Run every (method, seed); print the result lines; write the table and the figure
    (``scale``: another size than the paper's / ``--quick``, for tests)."""
    methods = opts.chosen_methods(METHODS)
    scale = scale or scale_of(opts)
    fed = federation_of(scale, opts.data_dir)
    out, runs = opts.folders(f"leaf-shakespeare-{'quick' if opts.quick else 'paper'}")
    done = run_method_seeds(
        opts,
        methods,
        lambda method, seed: run_overrides(opts, method, seed, scale, fed),
        runs,
        lambda folder, _: _last(folder),
    )
    rows: list[dict[str, Any]] = []
    series: dict[str, tuple[list[float], list[float]]] = {}
    for method in methods:
        summaries = [done[(method, seed)] for seed in range(opts.seeds)]
        row = row_of(method, summaries)
        rows.append(row)
        print(
            f"leaf shakespeare {method} acc={row['acc']['mean']:.4f} rounds={row['rounds']} "
            f"time_s={row['seconds']['mean']:.2f}",
            flush=True,
        )
        points = curve(Path(summaries[0]["folder"]), method)
        series[LABELS[method]] = ([r for r, _ in points], [a for _, a in points])
    out.mkdir(parents=True, exist_ok=True)
    plot_curves(
        series,
        out / "acc.png",
        "round",
        "test accuracy (seed 0)",
        "LEAF Shakespeare"
        + (" quick" if opts.quick else "")
        + ": FedAvg/FedProx global, others personalized",
    )
    result = {
        "experiment": "leaf-shakespeare",
        "quick": opts.quick,
        "seeds": opts.seeds,
        "clients": fed.clients,
        "scale": scale.__dict__,
        "description": describe(opts, scale, fed),
        "rows": rows,
    }
    text = markdown(rows)
    (out / "table.md").write_text(f"{result['description']}\n\n{text}")
    write_json_atomic(out / "table.json", result)
    if not opts.quiet:
        print(text, file=sys.stderr)
    return result


def _last(folder: Path) -> float:
    """The last evaluated accuracy of a run (personal where it has one), for the progress line."""
    rows = [r for r in read_metrics(folder) if "global_acc" in r]
    if not rows:
        return math.nan
    return rows[-1].get("personal_acc", rows[-1]["global_acc"])
