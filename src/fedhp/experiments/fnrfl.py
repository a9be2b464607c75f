"""``fnrfl-table2``: FNR-FL's Table 2/3 (Hu, Qiu, Tang) — accuracy, traffic and time of FNR-FL,
FedAvg, FedProx, SCAFFOLD, MOON, FedNova and the "X+FNR-FL" combinations under NIID-Bench's
feature, label and quantity skews, honest (D_pub held out of the training pool) by default.

Setup (the paper's, ``specs/fnr-fl.md``): 10 clients, all active, T = 10 rounds, E_train = 10
local epochs of SGD (lr 0.1, batch 64), E_re = 5 refinement epochs (batch 32), p = 0.5,
sample-weighted averaging of the whole state. ``--quick`` keeps a CPU run short: a
class-stratified subset of the data (2,000 train / 1,000 test), E_train = E_re = 2, a small VGG
with BatchNorm unless ``--model`` names another. ``--leak`` is the authors' protocol: D_pub is
the evaluation set itself (``public.source=test``, ``allow_test_leak``).

Prints one line per (skew, method): ``fnrfl <skew> <method> acc=<float> traffic_mb=<float>
time_s=<float>`` (acc: final-round global accuracy as the mean of per-class accuracies, mean over
seeds); writes ``table.md`` / ``table.json`` and one accuracy-per-round PNG per skew.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError
from fedhp.experiments.common import (
    ReproOptions,
    inputs_text,
    last_override,
    machine,
    markdown_table,
    print_result,
    run_seeds,
    run_tail,
    stat,
    write_study,
)
from fedhp.experiments.figures import read_metrics
from fedhp.reporting import plot_curves

NUM_CLIENTS = 10
BASES = ("fedavg", "fedprox", "scaffold", "moon", "fednova")
METHODS = ("fnrfl", *BASES, *(f"{b}+fnrfl" for b in BASES[1:]))
LABELS = {
    "fnrfl": "FNR-FL",
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "scaffold": "SCAFFOLD",
    "moon": "MOON",
    "fednova": "FedNova",
    "fedprox+fnrfl": "FedProx+FNR-FL",
    "scaffold+fnrfl": "SCAFFOLD+FNR-FL",
    "moon+fnrfl": "MOON+FNR-FL",
    "fednova+fnrfl": "FedNova+FNR-FL",
}
# Each baseline's own options: FedProx μ = 0.01 (the spec), MOON μ = 1 (MOON's paper for
# 10-class data without its CIFAR-10 tuning) and temperature 0.5 (the spec).
BASE_OPTIONS: dict[str, dict[str, float]] = {
    "fedprox": {"mu": 0.01},
    "moon": {"mu": 1.0, "temperature": 0.5},
}
SKEWS = ("feature", "label", "quantity", "label+feature", "mixed")
DEFAULT_SKEWS = ("feature", "label", "quantity")
NOISE = 0.1  # feature-skew σ (pixel units; the paper does not state Table 2's)

# Table 2 (CIFAR-10): method -> skew -> (ResNet-18, VGG-11); Table 3 (ResNet-18): traffic MB, s.
PAPER_ACC: dict[str, dict[str, tuple[float, float]]] = {
    "fnrfl": {"feature": (0.9976, 0.9931), "label": (0.9970, 0.9992), "quantity": (0.9982, 0.9939)},
    "fedavg": {
        "feature": (0.6001, 0.7485),
        "label": (0.8393, 0.8311),
        "quantity": (0.9107, 0.9194),
    },
    "fedprox": {
        "feature": (0.5956, 0.7285),
        "label": (0.8773, 0.8050),
        "quantity": (0.8874, 0.8916),
    },
    "scaffold": {
        "feature": (0.7425, 0.7733),
        "label": (0.9077, 0.8657),
        "quantity": (0.7017, 0.9064),
    },
    "moon": {"feature": (0.5530, 0.7193), "label": (0.6515, 0.8432), "quantity": (0.7336, 0.8424)},
    "fednova": {
        "feature": (0.6223, 0.7475),
        "label": (0.9043, 0.8522),
        "quantity": (0.7293, 0.7622),
    },
}
PAPER_TIME_S: dict[str, dict[str, float]] = {
    "fnrfl": {"feature": 6060, "label": 7133, "quantity": 5400},
    "fedavg": {"feature": 6840, "label": 6006, "quantity": 6786},
    "fedprox": {"feature": 8160, "label": 11310, "quantity": 9360},
    "scaffold": {"feature": 6840, "label": 7176, "quantity": 7332},
    "moon": {"feature": 10692, "label": 8814, "quantity": 11544},
    "fednova": {"feature": 6525, "label": 7098, "quantity": 6006},
}


@dataclass(frozen=True)
class Scale:
    """How big a run is: data kept, epochs, D_pub size and the default model."""

    train: int | None
    test: int | None
    epochs: int
    refine_epochs: int
    public_per_class: int
    model: str


PAPER_SCALE = Scale(None, None, epochs=10, refine_epochs=5, public_per_class=100, model="resnet18")
QUICK_SCALE = Scale(2000, 1000, epochs=2, refine_epochs=2, public_per_class=20, model="small")

MODELS: dict[str, list[str]] = {
    "resnet18": ["model.name=resnet18"],
    "vgg11": ["model.name=vgg", "model.cfg=vgg11", "model.batch_norm=true"],
    "small": ["model.name=vgg", "model.cfg=[16,M,32,M,64,M,128,M]", "model.batch_norm=true"],
}
MODEL_TEXT = {
    "resnet18": "ResNet-18 (CIFAR variant)",
    "vgg11": "VGG-11 with BatchNorm",
    "small": "small VGG [16,M,32,M,64,M,128,M] with BatchNorm",
}
# Pixel standard deviation of each dataset's normalization: NIID-Bench adds σ to pixels in
# [0, 1]; fedhp's features are normalized, so σ is divided by it (CIFAR-10: the channels' mean).
PIXEL_STD = {"mnist": 0.3081, "fmnist": 0.3530, "cifar10": (0.2470 + 0.2435 + 0.2616) / 3}


def scale_of(opts: ReproOptions) -> Scale:
    return QUICK_SCALE if opts.quick else PAPER_SCALE


def model_of(opts: ReproOptions) -> str:
    model = opts.model or scale_of(opts).model
    if model not in MODELS:
        raise ConfigError(f"--model: fnrfl-table2 runs {', '.join(MODELS)}; got {model!r}")
    return model


def feature_sigma(opts: ReproOptions) -> float:
    """The feature-skew σ in pixel units: ``NOISE``, or a ``partition.noise=`` override (given
    in fedhp's normalized units) converted back."""
    value = last_override(opts.extra, "partition.noise", "")
    return float(value) * PIXEL_STD[opts.dataset] if value else NOISE


def skew_overrides(skew: str, dataset: str) -> list[str]:
    """NIID-Bench's partition for ``skew`` (noise σ converted to fedhp's normalized units)."""
    sigma = NOISE / PIXEL_STD[dataset]
    if skew == "feature":
        return [
            "partition.name=feature_noise",
            f"partition.noise={sigma:.6g}",
            "partition.scale_by=num_clients_minus_1",
            "partition.resample=true",
        ]
    if skew in ("label", "label+feature"):
        noise = [f"partition.noise={sigma:.6g}"] if skew == "label+feature" else []
        return [
            "partition.name=dirichlet",
            "partition.alpha=0.5",
            "partition.min_samples=10",
            *noise,
        ]
    if skew == "quantity":
        return ["partition.name=quantity", "partition.beta=0.5", "partition.min_samples=10"]
    if skew == "mixed":
        return ["partition.name=mixed", "partition.alpha=0.5"]
    raise ConfigError(f"--skews: unknown {skew!r}; choose from {', '.join(SKEWS)}")


def method_overrides(method: str, scale: Scale, leak: bool) -> list[str]:
    """``algorithm.*`` overrides of one row: a baseline, or FNR-FL around a base."""
    common = [
        "algorithm.lr=0.1",
        "algorithm.batch_size=64",
        f"algorithm.local_epochs={scale.epochs}",
    ]
    if method in BASES:
        own = [f"algorithm.{k}={v}" for k, v in BASE_OPTIONS.get(method, {}).items()]
        return [f"algorithm.name={method}", *common, *own]
    base = method.split("+")[0] if "+" in method else "fedavg"
    base_opts = BASE_OPTIONS.get(base, {})
    out = [
        "algorithm.name=fnrfl",
        f"algorithm.base={base}",
        *common,
        f"algorithm.refine_epochs={scale.refine_epochs}",
        "algorithm.refine_batch=32",
        "algorithm.p=0.5",
    ]
    if base_opts:
        out.append(
            "algorithm.base_options={" + ", ".join(f"{k}: {v}" for k, v in base_opts.items()) + "}"
        )
    if leak:
        out.append("algorithm.allow_test_leak=true")
    return out


def run_overrides(opts: ReproOptions, skew: str, method: str, seed: int) -> list[str]:
    """Every override of one run."""
    scale, model = scale_of(opts), model_of(opts)
    rounds = opts.rounds if opts.rounds_given else 10
    if opts.leak:  # D_pub = the whole (subsampled) test pool: the clients' test sets' union
        test_size = scale.test if scale.test is not None else 10_000
        public = ["public.source=test", f"public.per_class={test_size // 10}"]
    else:
        public = [f"public.per_class={scale.public_per_class}"]
    out = [
        f"dataset.name={opts.dataset}",
        *([f"dataset.data_dir={opts.data_dir}"] if opts.data_dir else []),
        *([f"subsample.train={scale.train}"] if scale.train else []),
        *([f"subsample.test={scale.test}"] if scale.test else []),
        *public,
        *skew_overrides(skew, opts.dataset),
        f"federation.num_clients={NUM_CLIENTS}",
        "federation.num_edges=1",
        "federation.client_fraction=1.0",
        "federation.weighting=samples",
        *MODELS[model],
        *method_overrides(method, scale, opts.leak),
        f"rounds={rounds}",
        "eval_every=1",
        *run_tail(opts, seed, 5),
    ]
    return out


def paper_traffic_mb(method: str, num_params: int, rounds: int) -> float:
    """The paper's convention: 2 × n × T × model size (float32, MB = 10⁶ bytes), SCAFFOLD × 1.5."""
    factor = 1.5 if method.startswith("scaffold") else 1.0
    return factor * 2 * NUM_CLIENTS * rounds * num_params * 4 / 1e6


def row_of(skew: str, method: str, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row: mean ± std over seeds of accuracy (final, best), traffic, time, κ, ρ."""
    acc = [float(s.get("final_global_balanced_acc", math.nan)) for s in summaries]
    best = [float(s.get("best_global_balanced_acc", math.nan)) for s in summaries]
    plain = [float(s.get("final_global_acc", math.nan)) for s in summaries]
    traffic = [float(s["communication"]["bytes_total"]) / 1e6 for s in summaries]
    time_s = [float(s["seconds"]) for s in summaries]
    first = summaries[0]
    row = {
        "skew": skew,
        "method": method,
        "label": LABELS[method],
        "acc": stat(acc),
        "best_acc": stat(best),
        "plain_acc": stat(plain),
        "traffic_mb": stat(traffic),
        "paper_convention_traffic_mb": paper_traffic_mb(
            method, int(first["num_params"]), int(first["rounds"])
        ),
        "time_s": stat(time_s),
        "kappa": stat([a * 1e4 / t for a, t in zip(acc, time_s, strict=True)]),
        "rho": stat([a * 1e4 / m for a, m in zip(acc, traffic, strict=True)]),
        "seeds": len(summaries),
        "test_leak": bool(first.get("test_leak", False)),
        "stopped": [s["stopped"] for s in summaries if s.get("stopped")],
        "folders": [s["folder"] for s in summaries],
    }
    paper = PAPER_ACC.get(method, {}).get(skew)  # the paper has no X+FNR-FL rows
    row["paper_acc"] = {"resnet18": paper[0], "vgg11": paper[1]} if paper else None
    return row


def _cell(stat: dict[str, float], digits: int = 4) -> str:
    if math.isnan(stat["mean"]):
        return "—"
    text = f"{stat['mean']:.{digits}f}"
    return text if stat["std"] == 0 else f"{text} ± {stat['std']:.{digits}f}"


def markdown(rows: list[dict[str, Any]], model: str, dataset: str = "cifar10") -> str:
    """Table 2/3 side by side: measured (global balanced accuracy) and, for CIFAR-10 only, the
    paper's CIFAR-10 accuracy and time (its setting: full data, E_train = 10, E_re = 5, lr 0.1).
    Another dataset's table has no paper columns: the paper ran CIFAR-10 only."""
    paper_model = "vgg11" if model == "vgg11" else "resnet18"
    with_paper = dataset == "cifar10"
    header = ["skew", "method", "acc (final)", "acc (best)"]
    if with_paper:
        header.append(f"paper CIFAR-10 {paper_model} (full scale)")
    header += ["traffic MB", "paper-convention MB", "time s", "κ", "ρ"]
    if with_paper:
        header.append("paper time s (ResNet-18, its GPU)")
    body = []
    for r in rows:
        paper = r["paper_acc"][paper_model] if r["paper_acc"] else None
        ptime = PAPER_TIME_S.get(r["method"], {}).get(r["skew"])
        line = [
            r["skew"],
            r["label"] + (" ⚠ test leak" if r["test_leak"] else ""),
            _cell(r["acc"]),
            _cell(r["best_acc"]),
        ]
        if with_paper:
            line.append("—" if paper is None else f"{paper:.4f}")
        line += [
            _cell(r["traffic_mb"], 1),
            f"{r['paper_convention_traffic_mb']:.1f}",
            _cell(r["time_s"], 1),
            _cell(r["kappa"], 2),
            _cell(r["rho"], 2),
        ]
        if with_paper:
            line.append("—" if ptime is None else f"{ptime:.0f}")
        body.append(line)
    return markdown_table(header, body)


def describe(opts: ReproOptions) -> str:
    scale, model = scale_of(opts), model_of(opts)
    data = (
        "all of it"
        if scale.train is None
        else f"a class-stratified subset of {scale.train} train / {scale.test} test samples"
    )
    public = (
        "D_pub = the whole evaluation set (--leak: the authors' train-on-test protocol)"
        if opts.leak
        else f"D_pub = {scale.public_per_class} samples per class held out of the training pool "
        "(no client trains on it, no evaluation set contains it; the baselines lose it too)"
    )
    rounds = opts.rounds if opts.rounds_given else 10
    return (
        f"{opts.dataset} ({data}), {NUM_CLIENTS} clients all active, {MODEL_TEXT[model]}; "
        f"T = {rounds}, E_train = {scale.epochs}, E_re = {scale.refine_epochs}, SGD lr 0.1, "
        f"batch 64 (refinement 32), p = 0.5, λ = 0.1 (differentiable regularizer), "
        f"sample-weighted averaging; feature skew σ = {feature_sigma(opts):.3g} (pixel units) "
        "resampled at every "
        f"access; label skew Dir(0.5) with ≥ 10 samples; quantity skew Dir(0.5); {public}. "
        f"acc = final-round global accuracy as the mean of per-class accuracies (the paper's), "
        f"mean over seeds 0..{opts.seeds - 1}; time = wall seconds for the whole run "
        f"(evaluation every round included), torch threads = {opts.threads}, {opts.jobs} runs at "
        f"once ({machine()}). "
        f"{inputs_text(opts.dataset, opts.extra)}"
    ).rstrip()


def reproduce(opts: ReproOptions) -> dict[str, Any]:
    """Run every (skew, method, seed); print the result lines; write the table and figures."""
    skews = opts.skews or list(DEFAULT_SKEWS)
    methods = opts.chosen_methods(METHODS)
    for s in skews:
        skew_overrides(s, opts.dataset)  # validates the name
    tag = ("quick-" if opts.quick else "") + model_of(opts) + ("-leak" if opts.leak else "")
    out, runs = opts.folders(f"fnrfl-table2-{opts.dataset}-{tag}")
    done = run_seeds(
        opts,
        [(skew, method) for skew in skews for method in methods],
        lambda key, seed: run_overrides(opts, *key, seed),
        lambda key: runs / key[0] / key[1],
        lambda key: f"{key[0]} {key[1]}",
        lambda _, summary: summary.get("final_global_balanced_acc", math.nan),
    )
    rows = []
    for skew in skews:
        series = {}
        for method in methods:
            summaries = done[(skew, method)]
            row = row_of(skew, method, summaries)
            rows.append(row)
            formats = {"acc": ".4f", "traffic_mb": ".1f", "time_s": ".1f"}
            print_result(f"fnrfl {skew} {method}", row, formats)
            curve = read_metrics(Path(summaries[0]["folder"]))
            pts = [
                (r["round"], r["global_balanced_acc"]) for r in curve if "global_balanced_acc" in r
            ]
            series[LABELS[method]] = ([p[0] for p in pts], [p[1] for p in pts])
        out.mkdir(parents=True, exist_ok=True)
        plot_curves(
            series,
            out / f"acc-{skew.replace('+', '-')}.png",
            "round",
            "global balanced accuracy (seed 0)",
            f"FNR-FL Table 2, {opts.dataset}, {skew} skew{' (test leak)' if opts.leak else ''}",
        )
    text = markdown(rows, model_of(opts), opts.dataset)
    description = describe(opts)
    result = {
        "dataset": opts.dataset,
        "model": model_of(opts),
        "quick": opts.quick,
        "leak": opts.leak,
        "seeds": opts.seeds,
        "description": description,
        "rows": rows,
    }
    return write_study(opts, out, description, text, result)
