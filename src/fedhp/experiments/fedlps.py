"""``fedlps-table1`` and ``fedlps-ablation``: FedLPS's Table I (MNIST, CIFAR-10) and its ablation
(Xue et al.; ``specs/fedlps.md``), with training FLOPs, simulated time and time to accuracy.

Setup (the paper's / code's), MNIST: 100 clients with 2 label-sorted shards of 100 images each
(the code's ``nsamples=100`` per class per client: a class-stratified 20,000-image training
subset cut into 200 shards), 90/10 train / validation, each client's test set the same number of
images of each of its classes; 10 clients per round, 100 rounds, SGD lr 0.1, batch 20, 5 local
epochs, the 21,840-parameter CNN, sample-weighted aggregation. CIFAR-10 (the user's python
batches, ``--data-dir``): 50 clients (the spec) with 2 shards of 500 images (the whole training
set; the paper does not give the shard size), VGG-11 (without BatchNorm: see docs/fedlps.md),
TTA target 70 % (the paper's). ``--quick``: 30 rounds of 1 local epoch (a CPU check, not the
table). Accuracy is every method's personalized accuracy the same way: the mean over clients of
its personal model's accuracy on its own test data (the global model's for FedAvg).

Every row runs under FedLPS's heterogeneity and cost model (Dyn capabilities; the dense methods
FedAvg, FedPer, Ditto and Per-FedAvg with ``algorithm.capabilities=dyn``: full-width training,
slower on a weaker device), so the FLOPs, the simulated time and the TTA of every row come from
its own ``metrics.csv``. Prints one line per method: ``fedlps <experiment> <method>
acc=<float> flops=<float> sim_time_s=<float>`` (acc: final round, mean over seeds; flops:
training FLOPs of the whole run; sim_time_s: the run's simulated seconds); writes ``table.md`` /
``table.json`` and ``acc.png`` (accuracy vs round) next to the paper's numbers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError
from fedhp.experiments.common import (
    ReproOptions,
    inputs_text,
    machine,
    markdown_table,
    print_result,
    run_seeds,
    run_tail,
    stat,
    stat_cell,
    write_study,
)
from fedhp.experiments.figures import read_metrics
from fedhp.reporting import plot_curves, read_rows

TABLE1 = (
    "fedlps",
    "fedlps-mu0",
    "fedlps-code",
    "fedlps-authors",
    "fedavg",
    "heterofl",
    "fedrolex",
    "perfedavg",
    "fedper",
    "ditto",
    "lotteryfl",
)
TABLE1_EXTRA = ("fedlps-code-reset", "fedlps-code-arms", "fedlps-code-eval")
"""FedLPS rows that take one of the authors' code choices at a time (``--methods``)."""
DENSE = ("fedavg", "perfedavg", "fedper", "ditto")
"""Rows that train the full model (``capabilities`` off unless asked: :func:`method_overrides`
turns it on)."""
ABLATION = ("flst", "rcr-fix", "pucbv-fix", "rcr-dyn", "pucbv-dyn")
LABELS = {
    "fedlps": "FedLPS (μ = 1, paper)",
    "fedlps-mu0": "FedLPS (μ = 0)",
    "fedlps-code": "FedLPS (μ = 0, ordered scores, no STE: code)",
    "fedlps-code-reset": "FedLPS (code, scores reset every round)",
    "fedlps-code-arms": "FedLPS (code, P-UCBV arms over [0.5, 1))",
    "fedlps-code-eval": "FedLPS (code, evaluated as the code: models from s > ¼ only)",
    "fedlps-authors": "FedLPS (authors' code: arms [0.5, 1), models from s > ¼ only)",
    "fedavg": "FedAvg",
    "heterofl": "HeteroFL",
    "fedrolex": "FedRolex",
    "perfedavg": "Per-FedAvg",
    "fedper": "FedPer",
    "ditto": "Ditto",
    "lotteryfl": "LotteryFL",
    "flst": "FLST (s = 0.5)",
    "rcr-fix": "RCR-Fix",
    "pucbv-fix": "P-UCBV-Fix",
    "rcr-dyn": "RCR-Dyn",
    "pucbv-dyn": "P-UCBV-Dyn (FedLPS)",
}
# Table I and Table II (ablation) as the paper prints them, from its text
# (shared/seeds/003_*.txt): per method, (accuracy %, training FLOPs × 1e12) on MNIST and on
# CIFAR-10. Every FedLPS row of ours stands beside the paper's FedLPS row.
PAPER_TABLE1: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "fedlps": ((96.77, 0.8), (87.43, 268.5)),
    "fedavg": ((88.15, 2.8), (31.28, 825.4)),
    "heterofl": ((90.76, 1.1), (33.22, 380.1)),
    "fedrolex": ((93.73, 1.1), (33.59, 380.1)),
    "perfedavg": ((93.46, 2.8), (85.00, 660.3)),
    "fedper": ((93.45, 2.8), (79.76, 825.4)),
    "ditto": ((92.00, 5.6), (82.60, 1650.8)),
    "lotteryfl": ((93.37, 1.8), (75.71, 656.7)),
}
PAPER_ABLATION: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "flst": ((94.76, 1.4), (87.32, 412.9)),
    "rcr-fix": ((94.95, 1.1), (78.84, 394.3)),
    "pucbv-fix": ((95.72, 0.9), (80.71, 325.0)),
    "rcr-dyn": ((95.99, 1.1), (86.06, 380.1)),
    "pucbv-dyn": PAPER_TABLE1["fedlps"],  # FedLPS is P-UCBV-Dyn
}
FEDLPS_ROWS = tuple(m for m in (*TABLE1, *TABLE1_EXTRA) if m.startswith("fedlps"))
PAPER: dict[str, dict[str, tuple[float, float | None]]] = {
    dataset: {
        **{m: row[column] for m, row in (PAPER_TABLE1 | PAPER_ABLATION).items()},
        **{m: PAPER_TABLE1["fedlps"][column] for m in FEDLPS_ROWS},
    }
    for column, dataset in enumerate(("mnist", "cifar10"))
}
"""(accuracy %, training FLOPs × 1e12) per dataset and method."""
CODE_ARM = ["algorithm.mu=0", "algorithm.score_init=ordered", "algorithm.ste=false"]
FEDLPS_VARIANTS: dict[str, list[str]] = {
    "fedlps": [],
    "fedlps-mu0": ["algorithm.mu=0"],
    # The authors' code: L_pr off, scores from sort(randn) (the first units kept, in index order)
    # and no CE signal to them (spec); our scores persist across rounds, the code's are reset.
    "fedlps-code": CODE_ARM,
    # ... and, as the code does (initialize_mask), the scores re-initialized every round;
    "fedlps-code-reset": [*CODE_ARM, "algorithm.score_reset=true"],
    # ... with the code's P-UCBV arms over [0.5, 1) (the spec's `code` preset);
    "fedlps-code-arms": [*CODE_ARM, "algorithm.arms_low=0.5"],
    # ... evaluated as the code evaluates (FedLPS.py / Hetero_Client.py): a client's personal
    # model is stored only in rounds it trains at s > 1/4; one with none is scored on the global;
    "fedlps-code-eval": [*CODE_ARM, "algorithm.personal_keep_above=0.25"],
    # ... and both: the authors' code as far as fedhp follows it (scores persist here).
    "fedlps-authors": [
        *CODE_ARM,
        "algorithm.arms_low=0.5",
        "algorithm.personal_keep_above=0.25",
    ],
    "flst": ["algorithm.ratio=fixed", "algorithm.fixed_ratio=0.5", "algorithm.capabilities=dyn"],
    "rcr-fix": ["algorithm.ratio=capability", "algorithm.capabilities=fix"],
    "pucbv-fix": ["algorithm.ratio=pucbv", "algorithm.capabilities=fix"],
    "rcr-dyn": ["algorithm.ratio=capability", "algorithm.capabilities=dyn"],
    "pucbv-dyn": ["algorithm.ratio=pucbv", "algorithm.capabilities=dyn"],
}
PER_ROUND = 10
BATCH = 20


@dataclass(frozen=True)
class Setup:
    """One dataset's federation: clients, images per class per client (2 classes each), the
    default model's overrides and the TTA table's accuracy target."""

    clients: int
    per_class: int
    model: tuple[str, ...]
    target: float

    @property
    def train_per_client(self) -> int:
        """Training images of a client after the 10 % validation carve-out."""
        return 2 * self.per_class * 9 // 10


MNIST_SETUP = Setup(100, 100, ("model.name=cnn2",), 0.90)  # the code's nsamples = 100
SETUPS = {
    "mnist": MNIST_SETUP,
    "fmnist": MNIST_SETUP,
    # VGG-11 without BatchNorm: fedlps keeps no running statistics, and the authors' BatchNorm
    # without them (batch statistics at test time too) is not offered (docs/fedlps.md).
    "cifar10": Setup(50, 500, ("model.name=vgg", "model.cfg=vgg11"), 0.70),
}


def scale(opts: ReproOptions) -> tuple[int, int]:
    """(rounds, local epochs): the paper's 100 × 5, ``--quick`` 30 × 1, ``--rounds`` overrides."""
    rounds, epochs = (30, 1) if opts.quick else (100, 5)
    return (opts.rounds if opts.rounds_given else rounds), epochs


def method_overrides(
    method: str, epochs: int, rounds: int, setup: Setup = MNIST_SETUP
) -> list[str]:
    """``algorithm.*`` overrides of one row."""
    if method in FEDLPS_VARIANTS:
        return [
            "algorithm.name=fedlps",
            f"algorithm.local_epochs={epochs}",
            f"algorithm.rounds={rounds}",
            *FEDLPS_VARIANTS[method],
        ]
    # the dense rows carry FedLPS's device model (Dyn, like Table I): simulated time and TTA
    dense = ["algorithm.capabilities=dyn"] if method in DENSE else []
    if method == "perfedavg":  # no epoch budget: the same number of steps, each on 2 batches
        steps = epochs * math.ceil(setup.train_per_client / BATCH)
        return [
            "algorithm.name=perfedavg",
            f"algorithm.local_steps={steps}",
            "algorithm.alpha=0.01",
            "algorithm.beta=0.1",
            *dense,
        ]
    return [f"algorithm.name={method}", f"algorithm.local_epochs={epochs}", *dense]


def setup_of(opts: ReproOptions) -> Setup:
    """The federation of ``opts.dataset`` (one-line error for a dataset fedlps does not run)."""
    if opts.dataset not in SETUPS:
        raise ConfigError(f"--dataset: fedlps runs {', '.join(SETUPS)}; got {opts.dataset!r}")
    return SETUPS[opts.dataset]


def run_overrides(opts: ReproOptions, method: str, seed: int) -> list[str]:
    """Every override of one run."""
    rounds, epochs = scale(opts)
    setup = setup_of(opts)
    return [
        f"dataset.name={opts.dataset}",
        *([f"dataset.data_dir={opts.data_dir}"] if opts.data_dir else []),
        f"subsample.train={setup.clients * 2 * setup.per_class}",
        "partition.name=shards",
        "partition.shards_per_client=2",
        "partition.test_mix=equal",
        "partition.val_fraction=0.1",
        f"federation.num_clients={setup.clients}",
        "federation.num_edges=1",
        f"federation.client_fraction={PER_ROUND / setup.clients}",
        "federation.weighting=samples",
        *([f"model.name={opts.model}"] if opts.model else setup.model),
        *([] if method == "perfedavg" else ["algorithm.lr=0.1"]),  # (its steps: alpha, beta)
        f"algorithm.batch_size={BATCH}",
        *method_overrides(method, epochs, rounds, setup),
        f"rounds={rounds}",
        "eval_every=1",
        "eval_train=false",
        *run_tail(opts, seed, 10),
    ]


def personal_curve(folder: Path) -> list[tuple[int, float]]:
    """(round, mean over clients of the personal model's accuracy on its own test data) at every
    evaluated round (the global model's accuracy where the method has no personal models)."""
    per_round: dict[int, list[float]] = defaultdict(list)
    for row in read_rows(folder / "per_client.csv"):
        value = row["personal_acc"] if "personal_acc" in row else row["global_acc"]
        per_round[int(row["round"])].append(float(value))
    return [(r, sum(v) / len(v)) for r, v in sorted(per_round.items())]


def time_to_accuracy(folder: Path, target: float) -> float:
    """Simulated seconds (FedLPS's cost model) until the personal accuracy first reaches
    ``target`` (nan if never)."""
    sim = {
        int(r["round"]): float(r["sim_time_s"]) for r in read_metrics(folder) if "sim_time_s" in r
    }
    for rnd, acc in personal_curve(folder):
        if acc >= target and rnd in sim:
            return sim[rnd]
    return math.nan


def row_of(method: str, summaries: list[dict[str, Any]], opts: ReproOptions) -> dict[str, Any]:
    """One table row: accuracy (final, best), FLOPs, simulated time and TTA, mean ± std."""
    finals, bests, flops, sims, ttas = [], [], [], [], []
    for s in summaries:
        folder = Path(s["folder"])
        curve = personal_curve(folder)
        finals.append(curve[-1][1])
        bests.append(max(a for _, a in curve))
        metrics = read_metrics(folder)
        last = metrics[-1] if metrics else {}
        # every row carries FedLPS's cost model (the dense ones: capabilities=dyn)
        flops.append(float(last.get("flops", math.nan)))
        sims.append(float(last.get("sim_time_s", math.nan)))
        ttas.append(time_to_accuracy(folder, setup_of(opts).target))
    paper_acc, paper_flops = PAPER.get(opts.dataset, {}).get(method, (math.nan, None))
    return {
        "method": method,
        "label": LABELS[method],
        "acc": stat(finals),
        "best_acc": stat(bests),
        "flops": stat(flops),
        "sim_time_s": stat(sims),
        "tta_s": stat(ttas),
        "paper_acc": paper_acc / 100,
        "paper_flops": None if paper_flops is None else paper_flops * 1e12,
        "seconds": stat([float(s["seconds"]) for s in summaries]),
        "density": (
            density_breakdown(Path(summaries[0]["folder"])) if method in SPARSE_PERSONAL else None
        ),
        "stopped": [s["stopped"] for s in summaries if s.get("stopped")],
        "folders": [s["folder"] for s in summaries],
    }


DENSITY_EDGES = (0.0, 0.1, 0.2, 0.35, 0.6, 1.0)
SPARSE_PERSONAL = (*FEDLPS_VARIANTS, "lotteryfl")
"""Rows whose personal models are sparse full-size parameter vectors (``state["personal"]``)."""


def density_breakdown(folder: Path) -> list[dict[str, float]] | None:
    """The final round's personal accuracy grouped by the density of each client's evaluated
    model (its non-zero fraction, from ``final_state.pt``'s ``personal``, or ``global`` for a
    client that holds none under ``personal_keep_above``): one entry per density bin of
    :data:`DENSITY_EDGES` that holds clients (None without personal models)."""
    import torch

    from fedhp.engine.checkpoint import FINAL_STATE_FILE

    state = torch.load(folder / FINAL_STATE_FILE, weights_only=True)["state"]
    if "personal" not in state:
        return None
    models = state["personal"]
    if "has_personal" in state:
        models = torch.where(state["has_personal"] > 0, models, state["global"])
    density = (models != 0).double().mean(1).tolist()
    rows = read_rows(folder / "per_client.csv")
    last = max(int(r["round"]) for r in rows)
    acc = {int(r["client"]): float(r["personal_acc"]) for r in rows if int(r["round"]) == last}
    out = []
    for lo, hi in zip(DENSITY_EDGES, DENSITY_EDGES[1:], strict=False):
        group = [
            a for c, a in acc.items() if lo <= density[c] < hi or (hi == 1 and density[c] == 1)
        ]
        if group:
            out.append(
                {"low": lo, "high": hi, "clients": len(group), "acc": sum(group) / len(group)}
            )
    return out


def density_markdown(rows: list[dict[str, Any]]) -> str:
    """The rows' :func:`density_breakdown` as a table (seed 0), empty if no row has one."""
    body = []
    for r in rows:
        for b in r.get("density") or []:
            label = f"[{b['low']:.2f}, {b['high']:.2f}{']' if b['high'] == 1 else ')'}"
            body.append([r["label"], label, str(b["clients"]), f"{b['acc']:.4f}"])
    if not body:
        return ""
    header = ["method", "personal model density", "clients", "personal acc (final)"]
    return "\n\nPersonal accuracy by the density of each client's personal model (seed 0):\n\n" + (
        markdown_table(header, body)
    )


def markdown(rows: list[dict[str, Any]], target: float) -> str:
    header = [
        "method",
        "acc (final)",
        "acc (best)",
        "paper acc",
        "training FLOPs ×1e12",
        "paper FLOPs ×1e12",
        "sim. time s",
        f"TTA {target:.0%} s",
        "wall s",
    ]
    body = []
    for r in rows:
        flops = {k: v / 1e12 for k, v in r["flops"].items()}
        body.append(
            [
                r["label"],
                stat_cell(r["acc"], ".4f"),
                stat_cell(r["best_acc"], ".4f"),
                "—" if math.isnan(r["paper_acc"]) else f"{r['paper_acc']:.4f}",
                stat_cell(flops, ".3f"),
                "—" if r["paper_flops"] is None else f"{r['paper_flops'] / 1e12:.1f}",
                stat_cell(r["sim_time_s"], ".1f"),
                stat_cell(r["tta_s"], ".1f"),
                stat_cell(r["seconds"], ".0f"),
            ]
        )
    return markdown_table(header, body)


def describe(opts: ReproOptions) -> str:
    rounds, epochs = scale(opts)
    setup = setup_of(opts)
    model = opts.model or " ".join(o.split("=", 1)[1] for o in setup.model)
    return (
        f"{opts.dataset}, {setup.clients} clients × 2 label shards of {setup.per_class} images "
        f"(a class-stratified subset of {setup.clients * 2 * setup.per_class} training images; "
        f"90/10 train/validation; test images equal per own class), {PER_ROUND} per round, "
        f"R = {rounds}, {epochs} local epoch(s), SGD lr 0.1, batch {BATCH}, model "
        f"{model}, sample-weighted aggregation; capabilities "
        f"z ∈ {{1, ½, ¼, ⅛, 1/16}} (Dyn unless the row says Fix). acc "
        f"= mean over clients of the personal model's accuracy on its own test data (final "
        f"round; FedAvg: the global model), mean over seeds 0..{opts.seeds - 1}; FLOPs = 3 × "
        f"forward FLOPs of what was trained × samples (batch {BATCH}; the paper's MNIST FLOPs "
        f"match batch 32); sim. time and TTA (first round at ≥ {setup.target:.0%}) under FedLPS's "
        f"cost model, every row (FedAvg, FedPer, Ditto, Per-FedAvg train the full model "
        f"at any z); wall s: wall-clock seconds per run, torch "
        f"threads = {opts.threads}, {opts.jobs} runs at once ({machine()}). "
        f"{inputs_text(opts.dataset, opts.extra)}"
    ).rstrip()


def reproduce(opts: ReproOptions, experiment: str) -> dict[str, Any]:
    """Run every (method, seed) of ``experiment`` (``table1`` or ``ablation``); print the result
    lines; write the table and the figure."""
    default = TABLE1 if experiment == "table1" else ABLATION
    allowed = (*TABLE1, *TABLE1_EXTRA) if experiment == "table1" else ABLATION
    methods = opts.chosen_methods(default, allowed)
    tag = "quick" if opts.quick else "paper"
    out, runs = opts.folders(f"fedlps-{experiment}-{opts.dataset}-{tag}")
    done = run_seeds(
        opts,
        methods,
        lambda method, seed: run_overrides(opts, method, seed),
        lambda method: runs / method,
        str,
        lambda folder, _: personal_curve(folder)[-1][1],
    )
    rows: list[dict[str, Any]] = []
    series: dict[str, tuple[list[float], list[float]]] = {}
    for method in methods:
        summaries = done[method]
        row = row_of(method, summaries, opts)
        rows.append(row)
        formats = {"acc": ".4f", "flops": ".4g", "sim_time_s": ".2f"}
        print_result(f"fedlps {experiment} {method}", row, formats)
        curve = personal_curve(Path(summaries[0]["folder"]))
        series[LABELS[method]] = ([float(r) for r, _ in curve], [a for _, a in curve])
    out.mkdir(parents=True, exist_ok=True)
    plot_curves(
        series,
        out / "acc.png",
        "round",
        "personalized accuracy (mean over clients, seed 0)",
        f"FedLPS {experiment}, {opts.dataset}",
    )
    text = markdown(rows, setup_of(opts).target) + density_markdown(rows)
    description = describe(opts)
    result = {
        "experiment": experiment,
        "dataset": opts.dataset,
        "quick": opts.quick,
        "seeds": opts.seeds,
        "description": description,
        "rows": rows,
    }
    return write_study(opts, out, description, text, result)
