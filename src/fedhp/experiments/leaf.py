"""``leaf-shakespeare``: the FedProx paper's Shakespeare experiment (LEAF's data, the 2-layer
character LSTM) for FedAvg and FedProx, plus pFedMe, sFedHP, Ditto, FedPer and FedLPS on the same
clients and rounds (new rows nobody has published).

The paper's setting (its README, ``run_fedavg.sh`` / ``plot_final_e20.py`` and appendix):
LEAF ``-s niid --sf 0.2 -k 0 --tf 0.8 -t sample``, 10 clients per round, E = 20 local epochs of
batch 10, SGD lr 0.8, 40 rounds, μ = 0.001 for FedProx, the model embedding 8 → LSTM 256 →
LSTM 256 → linear, sample-weighted aggregation, accuracy of the global model on the union of the
clients' test windows. Each sampled client's local work: FedAvg's epochs where the method takes
``local_epochs``; pFedMe and sFedHP the same number of minibatch steps as FedAvg's mean client,
as R local rounds of K = 1 θ step on a fresh minibatch. sFedHP's edges are consecutive groups of
about 10 clients (the clients are in play order, so an edge holds a few plays), and it trains one
edge per round, so fewer clients than the flat methods' 10.

``--quick`` shrinks it to fit a CPU (the table says so): ``--sf 0.02`` (17 roles), 40-character
windows, LSTM 32, 20 local steps instead of 20 epochs, 100 rounds, class-stratified subsets of
15,000 training and 3,000 test windows (the roles' own windows, split as ``dataset.split`` says),
evaluation every 10 rounds, each row's step sizes chosen on validation windows
(:data:`QUICK_TUNED`).

Every table prints the trivial baseline — always predicting a space, scored on the runs' own test
targets — and flags (``⚠``, in the table, its footnote, ``table.json`` and the printed line) any
row at or within 1 point of it: such a model has learned nothing beyond the character frequency.

The runs join speeches with spaces (LEAF's text) and use the default leak-free positional split;
``dataset.split=fedprox`` (or ``leaf``) among the overrides runs that split instead: the clients
are counted with it, ``table.md`` opens with the split (a leaky one marked ``⚠ TEST LEAK``) and
the output folder gets a ``-<split>`` suffix.

One printed line per method: ``leaf shakespeare <method> acc=<f> rounds=<n> time_s=<f>`` (acc:
the final round's accuracy, the global model's on the union of the test windows for FedAvg and
FedProx, the personalized models' on each role's own test windows for the other rows; mean over
seeds); ``table.md`` / ``table.json`` and ``acc.png`` in the output folder.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedhp.algorithms import ALGORITHMS
from fedhp.config import parse_override
from fedhp.errors import ConfigError
from fedhp.experiments.common import (
    ReproOptions,
    machine,
    markdown_table,
    run_seeds,
    run_tail,
    stat,
    stat_cell,
    write_study,
)
from fedhp.experiments.figures import read_metrics
from fedhp.reporting import plot_curves

STRAGGLER_ROWS: dict[str, tuple[str, float | None, float]] = {
    "fedprox-mu0": ("fedprox", 0.0, 0.0),
    "fedavg-straggle50": ("fedavg", None, 0.5),
    "fedprox-mu0-straggle50": ("fedprox", 0.0, 0.5),
    "fedprox-straggle50": ("fedprox", None, 0.5),
    "fedavg-straggle90": ("fedavg", None, 0.9),
    "fedprox-mu0-straggle90": ("fedprox", 0.0, 0.9),
    "fedprox-straggle90": ("fedprox", None, 0.9),
}
"""The FedProx paper's systems-heterogeneity rows: row -> (algorithm, μ (None: the row's usual
0.001), straggler fraction). A straggler does 1 .. E-1 of its E local epochs (steps under
``--quick``), ``faults.straggler_work=partial``: FedProx keeps that work, FedAvg drops it."""
METHODS = ("fedavg", "fedprox", "pfedme", "sfedhp", "ditto", "fedper", "fedlps", *STRAGGLER_ROWS)
GLOBAL_ROWS = ("fedavg", "fedprox", *STRAGGLER_ROWS)
"""Rows scored by the global model (the paper's metric); the others by their personal models."""
LABELS = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx (μ = 0.001)",
    "pfedme": "pFedMe",
    "sfedhp": "sFedHP",
    "ditto": "Ditto",
    "fedper": "FedPer",
    "fedlps": "FedLPS",
    "fedprox-mu0": "FedProx (μ = 0)",
    "fedavg-straggle50": "FedAvg, 50 % stragglers (dropped)",
    "fedprox-mu0-straggle50": "FedProx (μ = 0), 50 % stragglers (kept)",
    "fedprox-straggle50": "FedProx (μ = 0.001), 50 % stragglers (kept)",
    "fedavg-straggle90": "FedAvg, 90 % stragglers (dropped)",
    "fedprox-mu0-straggle90": "FedProx (μ = 0), 90 % stragglers (kept)",
    "fedprox-straggle90": "FedProx (μ = 0.001), 90 % stragglers (kept)",
}
STRAGGLER_NOTE = (
    "Straggler rows (the paper's systems heterogeneity, faults.straggler_work=partial): each "
    "round each client straggles with the row's probability and then does 1 .. E-1 of its E "
    "local epochs (steps under --quick), drawn uniformly; FedProx keeps that partial work (μ = 0: "
    "FedAvg that keeps it), FedAvg drops it (the paper: an exact share of the sampled clients)."
)
PAPER_NOTE = (
    "The FedProx paper shows Shakespeare only as curves (test accuracy vs round, its Fig. 1 / "
    "appendix); no value was read off them here, so the paper column is empty."
)
K_STEPS = 1
"""pFedMe's and sFedHP's θ steps per local round (K); R = FedAvg's minibatch steps / K. K = 5
(the image tasks' value) with R = 4 left both at or below the always-space baseline: five steps
on one minibatch of 10 windows overfit θ to it, and four minibatches a round are too little data
(issue 43; docs/text.md, "What was wrong")."""
BASELINE_MARGIN = 0.01
"""A row whose accuracy is at most the trivial baseline plus this (1 point) is flagged."""
FLAG = "⚠"


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
    tuned: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per row, the ``algorithm.*`` values chosen on validation windows (they override the
    row's defaults); empty: untuned defaults."""
    init: str = "torch"
    """The LSTM's ``model.init``: ``tf`` is FedProx's TensorFlow model (one bias per gate block,
    forget-gate bias 1.0, Glorot-uniform weights)."""

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
            f"LSTM embed 8 → 2 × {self.hidden} (model.init={self.init}), "
            f"{self.per_round} clients per round, {local} of "
            f"batch {self.batch}, SGD lr {self.lr}"
            f"{' where the table gives no other' if self.tuned else ''}, {self.rounds} rounds, "
            f"evaluated every "
            f"{self.eval_every} rounds ({test} windows, class-stratified subsets)"
        )


QUICK_TUNED: dict[str, dict[str, Any]] = {
    "fedavg": {"lr": 1.6},
    "fedprox": {"lr": 1.6},
    "pfedme": {"personal_lr": 1.5},
    "sfedhp": {"lr": 1.5},
    "ditto": {"lr": 1.6},
    "fedper": {"lr": 1.6},
    "fedlps": {"lr": 1.6, "arms_low": 0.9},
}
"""``--quick``'s hyperparameters, each row's best final validation accuracy (its own metric) in
a one-off grid on validation windows (the last 10 % of each role's training windows after a
40-window gap; seed 0, the quick scale; FedLPS's arms on seeds 0 and 1):
docs/results/leaf-quick-grid/. FedProx and the straggler
rows take FedAvg's lr (μ is the paper's)."""

TUNED_NOTE = "bold: chosen on validation windows, docs/results/leaf-quick-grid"

PAPER_SCALE = Scale(0.2, 80, 256, 40, 20, None, 0.8, 10, 10, 1, None, init="tf")
QUICK_SCALE = Scale(0.02, 40, 32, 100, None, 20, 0.8, 10, 10, 10, 3000, 15000, QUICK_TUNED)


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
        "dataset.speech_separator=space",  # LEAF's text: line breaks become spaces
    ]
    return out + ([f"dataset.data_dir={data_dir}"] if data_dir else [])


SPLIT_KEYS = ("split", "min_lines", "train_fraction", "speech_separator", "seed")
"""The ``dataset.*`` options a user may override (``dataset.split=fedprox``) that change the
clients; :func:`federation_of` counts them with these."""


def dataset_choice(extra: Sequence[str]) -> dict[str, Any]:
    """The ``dataset.<SPLIT_KEYS>`` overrides among ``extra`` (the last of each wins)."""
    chosen: dict[str, Any] = {}
    for item in extra:
        dataset = parse_override(item).get("dataset")
        if isinstance(dataset, dict):
            chosen.update({k: v for k, v in dataset.items() if k in SPLIT_KEYS})
    return chosen


def split_text(extra: Sequence[str]) -> str:
    """Which split the runs used, the leaky ones marked as FNR-FL's ``--leak`` is."""
    from fedhp.data.shakespeare import LEAF_MIN_LINES, LEAKY_SPLITS

    choice = dataset_choice(extra)
    split = str(choice.get("split", "positional"))
    lines = int(choice.get("min_lines", 0))
    kept = (
        f"roles with ≤ {lines - 1} lines dropped (LEAF: {LEAF_MIN_LINES})"
        if lines
        else "all roles (no lines filter)"
    )
    if split in LEAKY_SPLITS:
        return f"Split: {split} ⚠ TEST LEAK ({LEAKY_SPLITS[split]}); {kept}."
    return f"Split: {split} (leak-free: no test character in any training window); {kept}."


@dataclass(frozen=True)
class Federation:
    """The clients the dataset yields at this scale."""

    clients: int
    mean_steps_per_epoch: float  # mean over clients of ceil(training windows / batch)

    @property
    def edges(self) -> int:
        return max(1, round(self.clients / 10))


def federation_of(scale: Scale, data_dir: str | None, extra: Sequence[str] = ()) -> Federation:
    """Count the clients (the parse is cached, so this is quick), with the runs' dataset
    options (LEAF's joining, and any ``dataset.split`` etc. among ``extra``)."""
    import torch

    from fedhp.data.shakespeare import ShakespeareSource
    from fedhp.registry import validate

    options = {
        "data_dir": data_dir,
        "sample_fraction": scale.sample_fraction,
        "seq_len": scale.seq_len,
        "train_fraction": 0.8,
        "speech_separator": "space",
        **dataset_choice(extra),
    }
    data = validate(ShakespeareSource, options, "dataset").load()
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
    if method in STRAGGLER_ROWS:
        return straggler_overrides(method, scale, fed)
    if method not in METHODS:
        raise ConfigError(f"--methods: unknown {method!r}; choose from {', '.join(METHODS)}")
    work = (
        [f"algorithm.local_epochs={scale.local_epochs}"]
        if scale.local_epochs is not None
        else [f"algorithm.local_steps={scale.local_steps}"]
    )
    name, batch = f"algorithm.name={method}", f"algorithm.batch_size={scale.batch}"
    common = [name, batch, f"algorithm.lr={scale.lr}"]
    tuned = [f"algorithm.{k}={v}" for k, v in scale.tuned.get(method, {}).items()]
    if method == "fedprox":
        return [*common, *work, "algorithm.mu=0.001", *tuned]
    if method in ("pfedme", "sfedhp"):
        # K = 1 θ step on each of R minibatches (R × K = FedAvg's steps), λ = 1
        rounds = max(1, round(local_steps(scale, fed) / K_STEPS))
        loop = [f"algorithm.K={K_STEPS}", f"algorithm.R={rounds}", "algorithm.lam=1.0"]
        if method == "pfedme":  # w_loc steps lr·λ = 0.8 of the way to θ
            return [*common, *loop, "algorithm.personal_lr=0.5", *tuned]
        # edge step η1·λ = 2: φ_i is halfway between w_i and the clients' mean θ, so w_i lands
        # on that mean (the image tasks' η1 = 0.8 with λ = 15 overshoots twelvefold and diverges)
        return [name, batch, "algorithm.lr=0.5", "algorithm.edge_lr=2.0", *loop, *tuned]
    if method == "fedlps":
        # μ = 0 (the authors' code), every device at full capability, P-UCBV's arms in [0.5, 1)
        # (--quick: from 0.75, chosen on validation),
        # Q's own step 0.01: with the defaults (μ = 1, ratios down to 1/16, Q stepped by ω's lr
        # 0.8) the masks reshuffle every step and no model leaves the always-space plateau
        fedlps = [
            f"algorithm.rounds={scale.rounds}",
            "algorithm.mu=0",
            "algorithm.capability_levels=[1.0]",
            "algorithm.arms_low=0.5",
            "algorithm.score_lr=0.01",
        ]
        return [*common, *work, *fedlps, *tuned]
    return [*common, *work, *tuned]  # fedavg, ditto, fedper


def algorithm_of(row: str) -> str:
    """The algorithm of a row (``fedprox-straggle50``: ``fedprox``)."""
    return STRAGGLER_ROWS[row][0] if row in STRAGGLER_ROWS else row


def straggler_overrides(row: str, scale: Scale, fed: Federation) -> list[str]:
    """A straggler row's overrides: its algorithm's, μ where the row sets it, and the faults."""
    algorithm, mu, fraction = STRAGGLER_ROWS[row]
    out = method_overrides(algorithm, scale, fed)
    if mu is not None:
        out = [o for o in out if not o.startswith("algorithm.mu=")] + [f"algorithm.mu={mu}"]
    if fraction > 0:  # (FedAvg drops its stragglers whatever straggler_work says)
        out.append(f"faults.straggler={fraction}")
        if ALGORITHMS.get(algorithm).keeps_partial_work:
            out.append("faults.straggler_work=partial")
    return out


def sampling_overrides(method: str, scale: Scale, fed: Federation) -> list[str]:
    """Who trains each round: sFedHP (hierarchical) one edge, the flat methods a fraction of the
    clients (each reads only its own kind of sampling)."""
    if ALGORITHMS.get(algorithm_of(method)).hierarchical:
        return ["federation.edges_per_round=1"]
    return [f"federation.client_fraction={min(1.0, scale.per_round / fed.clients)}"]


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
        *sampling_overrides(method, scale, fed),
        "federation.weighting=samples",
        "model.name=lstm",
        "model.embed_dim=8",
        f"model.hidden={scale.hidden}",
        "model.layers=2",
        f"model.init={scale.init}",
        *method_overrides(method, scale, fed),
        f"rounds={scale.rounds}",
        f"eval_every={scale.eval_every}",
        "eval_train=false",
        *run_tail(opts, seed, 10),
    ]


def curve(folder: Path, method: str) -> list[tuple[float, float]]:
    """(round, the row's accuracy) at every evaluated round."""
    key = "global_acc" if method in GLOBAL_ROWS else "personal_acc"
    return [(r["round"], r[key]) for r in read_metrics(folder) if key in r]


def row_of(method: str, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row: the row's accuracy (final, best), global and personal, time."""

    def get(key: str) -> dict[str, float]:
        return stat([float(s.get(key, math.nan)) for s in summaries])

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
        "train_flops": None if None in flops else stat([float(f) for f in flops]),  # type: ignore[arg-type]
        "paper_acc": None,
        "stopped": [s["stopped"] for s in summaries if s.get("stopped")],
        "folders": [s["folder"] for s in summaries],
    }


def trivial_baseline(overrides: list[list[str]]) -> dict[str, Any]:
    """The accuracy of always predicting a space on the test targets the runs are scored on
    (every role's test windows: their union for the global rows, each role's own for the
    personal rows — the same windows, so one number), for each seed's ``overrides`` (the
    ``subsample`` depends on the seed), and the most frequent target character."""
    import torch

    from fedhp.build import partition_data
    from fedhp.config import resolve_config
    from fedhp.data.shakespeare import ALL_LETTERS

    space = ALL_LETTERS.index(" ")
    shares, majority = [], []
    for item in overrides:
        _, clients, _ = partition_data(resolve_config(None, item, refuse_unread=False))
        y = torch.cat([c.test_y for c in clients])
        counts = torch.bincount(y)
        shares.append(float(counts[space]) / max(1, int(y.numel())))
        majority.append(int(counts.argmax()))
    top = max(set(majority), key=majority.count)
    return {
        "acc": stat(shares),
        "majority": repr(ALL_LETTERS[top]) if top < len(ALL_LETTERS) else "unknown",
        "margin": BASELINE_MARGIN,
    }


def flagged(acc: float, baseline: float, margin: float = BASELINE_MARGIN) -> bool:
    """Whether an accuracy is not clearly above the trivial baseline: at most ``baseline +
    margin``, or not a number (a run that stopped)."""
    return not acc > baseline + margin


def _acc_cell(stat: dict[str, float] | None, baseline: float | None) -> str:
    """An accuracy cell, marked where it is not clearly above the baseline."""
    text = stat_cell(stat)
    if baseline is None or stat is None or text == "—":
        return text
    return f"{text} {FLAG}" if flagged(stat["mean"], baseline) else text


def hyper_text(overrides: list[str], tuned: dict[str, Any]) -> str:
    """A row's ``algorithm.*`` settings (name and batch left out), those chosen on validation
    in bold."""
    parts: dict[str, str] = {}
    for item in overrides:
        key, _, value = item.partition("=")
        if key.startswith("algorithm.") and key not in ("algorithm.name", "algorithm.batch_size"):
            parts[key.removeprefix("algorithm.")] = value
    return ", ".join(f"{k} **{v}**" if k in tuned else f"{k} {v}" for k, v in parts.items())


def baseline_note(baseline: dict[str, Any]) -> str:
    """The line under the table that explains the trivial baseline and the flag."""
    acc = baseline["acc"]["mean"]
    return (
        f"Trivial baseline: always predicting a space scores {acc:.4f} on these test targets "
        f"(the most frequent target: {baseline['majority']}). {FLAG}: at or within "
        f"{100 * baseline['margin']:.0f} point of it — the model has learned no more than the "
        f"character frequency; not a result."
    )


def markdown(rows: list[dict[str, Any]], baseline: dict[str, Any] | None = None) -> str:
    """The table (the trivial baseline as its first row and a footnote, when given)."""
    line = None if baseline is None else baseline["acc"]["mean"]
    header = [
        "method",
        "acc (final)",
        "acc (best)",
        "scored by",
        "global acc (final)",
        "personal acc (final)",
        "paper acc",
        "rounds",
        "hyperparameters (bold: chosen on validation)",
        "training FLOPs",
        "wall s",
    ]
    body = [
        [
            f"{r['label']} {FLAG}" if r.get("flagged") else r["label"],
            _acc_cell(r["acc"], line),
            _acc_cell(r["best_acc"], line),
            "global model, union of test windows"
            if r["metric"] == "global_acc"
            else "own personal model, own test windows",
            _acc_cell(r["global_acc"], line),
            _acc_cell(r["personal_acc"], line),
            "—",
            str(r["rounds"]),
            r.get("hyperparameters", ""),
            stat_cell(r["train_flops"], ".3g"),
            stat_cell(r["seconds"], ".0f"),
        ]
        for r in rows
    ]
    if baseline is not None:
        acc = stat_cell(baseline["acc"])
        trivial = "always a space (trivial baseline)"
        body.insert(0, [trivial, acc, "—", "the test targets", acc, acc, "—", "—", "—", "0", "—"])
    table = markdown_table(header, body)
    return table if baseline is None else f"{table}\n{baseline_note(baseline)}\n"


def describe(opts: ReproOptions, scale: Scale, fed: Federation) -> str:
    size = "QUICK CPU VERSION (not the paper's scale): " if opts.quick else "The paper's scale: "
    return (
        f"{size}{scale.text()}; {fed.clients} clients (roles), sample-weighted aggregation; "
        f"pFedMe / sFedHP: R = {max(1, round(local_steps(scale, fed) / K_STEPS))} local rounds "
        f"of K = {K_STEPS} θ step on a fresh minibatch each (R·K = FedAvg's steps), λ = 1; "
        f"sFedHP: edge step η1 = 2 (η1·λ = 2), {fed.edges} edges of consecutive clients, 1 per "
        f"round (so 8-9 clients train a round, not 10, and its FLOPs are lower); FedProx "
        f"μ = 0.001; Ditto λ = 0.1; FedPer: output layer personal; FedLPS: unit masks on the "
        f"LSTM hidden units, P-UCBV ratios in [arms_low, 1), every device at full capability, "
        f"μ = 0, score step 0.01. The per-row hyperparameters are in the table "
        f"({TUNED_NOTE if scale.tuned else 'not tuned'}). "
        f"Seeds 0..{opts.seeds - 1}; torch threads = {opts.threads}, {opts.jobs} run(s) at once "
        f"({machine()}). {PAPER_NOTE} {STRAGGLER_NOTE}"
    )


def reproduce(opts: ReproOptions, scale: Scale | None = None) -> dict[str, Any]:
    """Run every (method, seed); print the result lines; write the table and the figure
    (``scale``: another size than the paper's / ``--quick``, for tests)."""
    methods = opts.chosen_methods(METHODS)
    scale = scale or scale_of(opts)
    fed = federation_of(scale, opts.data_dir, opts.extra)
    split = str(dataset_choice(opts.extra).get("split", "positional"))
    tag = ("quick" if opts.quick else "paper") + ("" if split == "positional" else f"-{split}")
    out, runs = opts.folders(f"leaf-shakespeare-{tag}")
    done = run_seeds(
        opts,
        methods,
        lambda method, seed: run_overrides(opts, method, seed, scale, fed),
        lambda method: runs / method,
        str,
        lambda folder, _: _last(folder),
    )
    baseline = trivial_baseline(
        [run_overrides(opts, methods[0], seed, scale, fed) for seed in range(opts.seeds)]
    )
    line = baseline["acc"]["mean"]
    print(f"trivial baseline: leaf shakespeare always-space acc={line:.4f}", flush=True)
    rows: list[dict[str, Any]] = []
    series: dict[str, tuple[list[float], list[float]]] = {}
    for method in methods:
        summaries = done[method]
        row = row_of(method, summaries)
        row["hyperparameters"] = hyper_text(
            method_overrides(method, scale, fed), scale.tuned.get(algorithm_of(method), {})
        )
        row["flagged"] = flagged(row["acc"]["mean"], line)
        rows.append(row)
        print(
            f"leaf shakespeare {method} acc={row['acc']['mean']:.4f} rounds={row['rounds']} "
            f"time_s={row['seconds']['mean']:.2f}"
            + (
                f" {FLAG} NOT ABOVE THE ALWAYS-SPACE BASELINE ({line:.4f} + "
                f"{100 * BASELINE_MARGIN:.0f} point): not a result"
                if row["flagged"]
                else ""
            ),
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
        + f", split {split}"
        + (" (test leak)" if split != "positional" else "")
        + ": FedAvg/FedProx global, others personalized",
    )
    result = {
        "experiment": "leaf-shakespeare",
        "quick": opts.quick,
        "seeds": opts.seeds,
        "clients": fed.clients,
        "split": split,
        "test_leak": split != "positional",
        "split_text": split_text(opts.extra),
        "scale": scale.__dict__,
        "description": describe(opts, scale, fed),
        "baseline": baseline,
        "flagged": [r["method"] for r in rows if r["flagged"]],
        "rows": rows,
    }
    text = markdown(rows, baseline)
    head = f"{result['split_text']}\n\n{result['description']}"
    return write_study(opts, out, head, text, result)


def _last(folder: Path) -> float:
    """The last evaluated accuracy of a run (personal where it has one), for the progress line."""
    rows = [r for r in read_metrics(folder) if "global_acc" in r]
    if not rows:
        return math.nan
    return rows[-1].get("personal_acc", rows[-1]["global_acc"])
