"""``dp``: the accuracy–ε curve of client-level DP (DP-FedAvg, McMahan et al., ICLR 2018) on
MNIST with 1,000 clients (issue 20).

Setup: MNIST, ``partition.name=shards`` (McMahan et al.'s pathological non-IID split: the 60,000
training images sorted by label and cut into 2,000 shards of 30, two per client, so 60 images of
one or two digits each), 1,000 clients, the whole test set (10,000 images, each client's share in
its label mix) evaluated with the global model; uniform weighting (DP bounds each client's
share). FedAvg samples each client with probability q = 0.1 per round (Poisson sampling,
100 clients per round in expectation), each runs 6 SGD steps of batch 10 (one epoch of its 60
images) at lr 0.1; the cloud clips each update to S = 0.5, adds N(0, σ²S²) to the sum and
divides by q·N = 100. T = 200 rounds by default (``--rounds``; ``--quick``: 40), model
DNN 784-100-10 (``--model``).

For each target ε ∈ {1, 2, 4, 8} (δ = 1e-5, RDP) σ is calibrated for T rounds at q
(:func:`fedhp.privacy.accountant.calibrate_noise`, the run's sampling, releases); ε = ∞ is the
same run with privacy on but σ = 0 and S = ∞ (plain FedAvg, bit for bit, under the same Poisson
sampling). ``--methods fedavg,hierfavg`` adds HierFAVG with the noise at each of 10 edges of 100
clients (every client trains every round, κ1 = 3, κ2 = 2; fixed sampling of all clients, each
edge aggregation a release, no amplification; T = 50 by default, ``--quick`` 10: each of its
rounds trains all 1,000 clients).

Prints one line per (method, ε): ``dp <method> eps=<float> acc=<float>`` (the realized ε from
the run's summary.json, the final global accuracy, mean over seeds); writes ``table.md`` /
``table.json`` and ``acc-vs-eps.png``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError
from fedhp.experiments.common import (
    MODEL_TEXT,
    MODELS,
    ReproOptions,
    inputs_text,
    machine,
    pct,
    run_seeds,
    seed_stats,
    write_study,
)
from fedhp.reporting import Line, plot_lines
from fedhp.tables import markdown_table

NAME = "dp"
EPSILONS = (1.0, 2.0, 4.0, 8.0, math.inf)
DELTA = 1e-5
NUM_CLIENTS = 1000
RATE = 0.1  # Poisson sampling rate q
CLIP = 0.5
LR, BATCH, STEPS = 0.1, 10, 6
# Rounds per method (full, --quick): a HierFAVG round trains all 1,000 clients, 10× FedAvg's.
ROUNDS = {"fedavg": (200, 40), "hierfavg": (50, 10)}
METHODS = ("fedavg", "hierfavg")
LABELS = {"fedavg": "DP-FedAvg (noise at the cloud)", "hierfavg": "HierFAVG (noise at each edge)"}
METHOD_OVERRIDES = {
    "fedavg": [
        "algorithm.name=fedavg",
        f"algorithm.local_steps={STEPS}",
        f"federation.client_fraction={RATE}",
        "privacy.sampling=poisson",
        "privacy.where=cloud",
    ],
    "hierfavg": [
        "algorithm.name=hierfavg",
        "algorithm.kappa1=3",
        "algorithm.kappa2=2",
        "federation.num_edges=10",
        "privacy.sampling=fixed",
        "privacy.where=edge",
    ],
}


def rounds_of(opts: ReproOptions, method: str = "fedavg") -> int:
    """``--rounds`` if given, else the method's default (``--quick``: its short one)."""
    if opts.rounds_given:
        return opts.rounds
    full, quick = ROUNDS[method]
    return quick if opts.quick else full


def model_of(opts: ReproOptions) -> str:
    model = opts.model or "dnn"
    if model not in ("dnn", "mlr"):
        raise ConfigError(f"--model: dp runs dnn or mlr (MNIST), got {model!r}")
    return model


def base_overrides(opts: ReproOptions, method: str, seed: int) -> list[str]:
    """Every override of one run but the noise (privacy enabled, σ = 0, S = ∞)."""
    out = [
        "dataset.name=mnist",
        "partition.name=shards",
        "partition.shards_per_client=2",
        f"federation.num_clients={NUM_CLIENTS}",
        "federation.weighting=uniform",
        *MODELS[model_of(opts)],
        f"algorithm.lr={LR}",
        f"algorithm.batch_size={BATCH}",
        *METHOD_OVERRIDES[method],
        "privacy.enabled=true",
        f"privacy.delta={DELTA}",
        "privacy.accountant=rdp",
        "privacy.noise_multiplier=0",
        "privacy.clip_norm=.inf",
        f"rounds={rounds_of(opts, method)}",
        f"eval_every={opts.eval_every}",
        "eval_train=false",
        f"threads={opts.threads}",
        "progress=false",
        "checkpoint_every=50",
        f"seed={seed}",
    ]
    if opts.data_dir is not None:
        out.append(f"dataset.data_dir={opts.data_dir}")
    return [*out, *opts.extra]


def noise_for(overrides: list[str], epsilon: float) -> float:
    """σ that makes the run of ``overrides`` reach ``epsilon`` at its δ after its rounds."""
    from fedhp.algorithms import ALGORITHMS
    from fedhp.config import resolve_config
    from fedhp.engine.privacy_budget import round_sampling
    from fedhp.privacy.accountant import calibrate_noise

    cfg = resolve_config(None, overrides)
    options = ALGORITHMS.build(cfg.algorithm, "algorithm")
    return calibrate_noise(
        epsilon,
        cfg.privacy.delta,
        cfg.rounds,
        population=cfg.federation.num_clients,
        sampling=cfg.privacy.sampling,
        accountant=cfg.privacy.accountant,
        **round_sampling(cfg, options),
    )


def run_overrides(opts: ReproOptions, method: str, epsilon: float, seed: int) -> list[str]:
    """The run of ``method`` at target ``epsilon`` (∞: no noise, no clipping)."""
    base = base_overrides(opts, method, seed)
    if math.isinf(epsilon):
        return base
    sigma = noise_for(base, epsilon)
    return [*base, f"privacy.noise_multiplier={sigma!r}", f"privacy.clip_norm={CLIP}"]


def _tag(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def _eps(summary: dict[str, Any]) -> float:
    eps = summary.get("privacy", {}).get("epsilon")
    return math.inf if eps is None else float(eps)


def row_of(method: str, target: float, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    privacy = summaries[0].get("privacy", {})
    out: dict[str, Any] = {
        "method": method,
        "target_epsilon": None if math.isinf(target) else target,
        "epsilon": None if math.isinf(_eps(summaries[0])) else _eps(summaries[0]),
        "noise_multiplier": privacy.get("noise_multiplier"),
        "clip_norm": privacy.get("clip_norm"),
        "rounds": summaries[0].get("rounds"),
        "folders": [s["folder"] for s in summaries],
    }
    out.update(seed_stats(summaries, ("final_global_acc", "best_global_acc", "seconds")))
    return out


def _num(value: float | None, digits: int = 3) -> str:
    return "∞" if value is None else f"{value:.{digits}f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    header = [
        "method",
        "target ε",
        "rounds",
        "σ",
        "S",
        "realized ε (δ = 1e-5)",
        "final acc (%)",
        "best acc (%)",
        "time (s)",
    ]
    body = []
    for r in rows:
        body.append(
            [
                r["method"],
                _num(r["target_epsilon"], 0),
                str(r["rounds"]),
                f"{r['noise_multiplier']:.4f}",
                _num(r["clip_norm"], 2),
                _num(r["epsilon"], 4),
                pct(r["final_global_acc"]),
                pct(r["best_global_acc"]),
                f"{r['seconds']['mean']:.0f}",
            ]
        )
    return markdown_table(header, body)


def describe(opts: ReproOptions) -> str:
    return (
        f"MNIST, {NUM_CLIENTS} clients, shards partition (2 label-sorted shards of 30 images "
        f"each), {MODEL_TEXT[model_of(opts)]}, uniform weighting; FedAvg: Poisson sampling "
        f"q = {RATE} (≈ {RATE * NUM_CLIENTS:.0f} clients per round), {STEPS} SGD steps of batch "
        f"{BATCH} at lr {LR} per client per round, updates clipped to S = {CLIP} at the cloud, "
        f"noise σ·S on the sum, divided by q·N; T = {rounds_of(opts)} rounds, evaluated every "
        f"{opts.eval_every} on the 10,000 test images; σ calibrated per target ε at δ = {DELTA} "
        f"(dp-accounting RDP); ε = ∞: σ = 0, S = ∞ (plain FedAvg, same sampling). HierFAVG "
        f"(if run): 10 edges of 100 clients, every client every round, κ1 = 3, κ2 = 2, S = "
        f"{CLIP} and noise at each edge, T = {rounds_of(opts, 'hierfavg')} rounds, fixed "
        f"sampling of all clients (no amplification), κ2 releases per round. Seeds "
        f"0..{opts.seeds - 1}; torch threads = {opts.threads}, {opts.jobs} run(s) at once "
        f"({machine()}). "
        f"{inputs_text('mnist', opts.extra)}"
    )


def plot(rows: list[dict[str, Any]], methods: list[str], out_png: Path) -> None:
    """Final accuracy against ε per method; ε = ∞ as a dashed level."""
    lines = []
    colors = {"fedavg": "tab:blue", "hierfavg": "tab:orange"}
    finite = [e for e in EPSILONS if math.isfinite(e)]
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        pts = [r for r in mine if r["target_epsilon"] is not None]
        x = [r["epsilon"] for r in pts]
        y = [100 * r["final_global_acc"]["mean"] for r in pts]
        sd = [100 * r["final_global_acc"]["std"] for r in pts]
        color = colors.get(method)
        label = f"{LABELS[method]}, T = {mine[0]['rounds']}"
        lines.append(Line(label, x, y, std=sd, color=color, marker="o"))
        for r in mine:
            if r["target_epsilon"] is None:
                level = 100 * r["final_global_acc"]["mean"]
                label = f"{method}, ε = ∞ (no DP): {level:.1f} %"
                lines.append(Line(label, [finite[0], finite[-1]], [level, level], color=color))
    plot_lines(
        lines,
        out_png,
        "ε (δ = 1e-5)",
        "final global accuracy (%)",
        f"Client-level DP on MNIST, {NUM_CLIENTS} clients",
    )


def reproduce(opts: ReproOptions) -> dict[str, Any]:
    """Run every (method, ε, seed); print the result lines; write the table and the figure."""
    if opts.dataset != "mnist":
        raise ConfigError(f"--dataset: dp runs on mnist, got {opts.dataset!r}")
    methods = opts.chosen_methods(["fedavg"], METHODS)
    tag = ("quick-" if opts.quick else "") + model_of(opts)
    out, runs = opts.folders(f"dp-{opts.dataset}-{tag}")
    done = run_seeds(
        opts,
        [(method, eps) for method in methods for eps in EPSILONS],
        lambda key, seed: run_overrides(opts, *key, seed),
        lambda key: runs / key[0] / f"eps{_tag(key[1])}",
        lambda key: f"{key[0]} eps={_tag(key[1])}",
    )
    rows = []
    for method in methods:
        for eps in EPSILONS:
            row = row_of(method, eps, done[(method, eps)])
            rows.append(row)
            realized = math.inf if row["epsilon"] is None else row["epsilon"]
            print(f"dp {method} eps={realized:.4f} acc={row['final_global_acc']['mean']:.4f}")
    text = markdown(rows)
    description = describe(opts)
    result = {
        "dataset": opts.dataset,
        "model": model_of(opts),
        "rounds": {m: rounds_of(opts, m) for m in methods},
        "seeds": opts.seeds,
        "delta": DELTA,
        "clip_norm": CLIP,
        "sample_rate": RATE,
        "num_clients": NUM_CLIENTS,
        "description": description,
        "rows": rows,
    }
    write_study(opts, out, description, text, result)
    plot(rows, methods, out / "acc-vs-eps.png")
    return result
