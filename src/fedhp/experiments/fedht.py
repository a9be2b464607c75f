"""``fedht-*``: the experiments of "Federated Nonconvex Sparse Learning" (Tong et al.).

For one problem (Simulation I / II, MNIST, a LibSVM file) and the three methods (Distributed-IHT,
Fed-HT, FedIter-HT):

1. *Tuning* on the training objective: every γ of the paper's grid {10, …, 0.001} extended below
   1e-3 by {6e-4, 3e-4, 1e-4} (the literal grid diverges or stalls on Simulation I: the clients'
   smoothness is ~2,000), and every K ∈ {3, 5, 8, 10} (Distributed-IHT: K = 1), for ``tune_rounds``
   rounds; the final objective of each run goes to ``tuning.json`` (``inf``: diverged).
2. *Shared γ* (the headline): among the *stable* γ (every method, every K ends below f(x₀)), the
   one at which all three do best together — the smallest Σ_m log(f_m(γ) / min_γ' f_m(γ')) —,
   each method with its best K at that γ.
3. *Per-method tuned* (``<experiment>-tuned``): each method at its own best (γ, K).
4. Full runs evaluated every round: the target is Distributed-IHT's objective at ``target_round``;
   rounds and simulated time (150 ms per communication round + 20 µs per local step) to reach it.

Writes ``table.md`` / ``table.json``, ``tuning.json`` and PNG figures; prints one line per method:
``fedht <experiment> <method> rounds_to_target=<int|never> objective_final=<float>
sim_time_to_target_s=<float>``.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError
from fedhp.experiments.common import (
    ReproOptions,
    inputs_text,
    log,
    map_runs,
    markdown_table,
    overrides_text,
    run_config,
    write_table,
)
from fedhp.experiments.figures import read_metrics
from fedhp.reporting import plot_curves, write_json_atomic

METHODS = ("diht", "fedht", "fediterht")
LABELS = {"diht": "Distributed-IHT", "fedht": "Fed-HT", "fediterht": "FedIter-HT"}
PAPER_GRID = (10.0, 1.0, 0.6, 0.3, 0.1, 0.06, 0.03, 0.01, 0.001)
EXTENDED = (6e-4, 3e-4, 1e-4)
KS = (3, 5, 8, 10)
COMM_S, STEP_S = 0.150, 20e-6  # the paper's time model: per communication round, per local step


@dataclass
class Problem:
    """One experiment: its data/model overrides and round budget."""

    name: str
    overrides: list[str]
    tune_rounds: int
    rounds: int = 200
    target_round: int = 100
    gammas: tuple[float, ...] = PAPER_GRID + EXTENDED
    ks: tuple[int, ...] = KS
    # full runs: evaluate every n rounds (MNIST/LibSVM: 5, evaluation is costly)
    eval_every: int = 1


def _common(tau: int, batch: int, clients: int) -> list[str]:
    return [
        f"federation.num_clients={clients}",
        "federation.num_edges=1",
        "federation.weighting=uniform",
        f"algorithm.tau={tau}",
        f"algorithm.batch_size={batch}",
        "progress=false",
        "checkpoint_every=0",
        "max_loss=null",
    ]


def problems(opts: ReproOptions, path: str | None = None) -> dict[str, Problem]:
    """The experiments' settings (``--rounds`` replaces the full runs' length)."""
    sim = ["dataset.name=fedht_sim", "partition.name=natural"]
    out = {
        "sim1": Problem(
            "sim1",
            [*sim, "dataset.task=linear", "model.name=linreg", *_common(200, 32, 100)],
            tune_rounds=100,
        ),
        "sim2": Problem(
            "sim2",
            [
                *sim,
                "dataset.task=logistic",
                "dataset.samples=1000",
                "dataset.test_samples=100",
                "dataset.alpha=1.0",
                "dataset.beta=1.0",
                "model.name=logreg",
                "model.lam=0.0001",
                *_common(200, 32, 100),
            ],
            rounds=300,
            target_round=200,
            tune_rounds=100,
        ),
        "mnist": Problem(
            "mnist",
            [
                "dataset.name=mnist",
                "partition.name=categories",
                "partition.category=label",
                "model.name=softmax",
                "model.lam=0.0001",
                *_common(500, 32, 100),
            ],
            tune_rounds=50,
            eval_every=5,
            gammas=PAPER_GRID,  # the literal grid does not diverge on MNIST
        ),
        "noiseless": Problem(
            "noiseless",
            [
                "dataset.name=gaussian_sparse",
                "partition.name=natural",
                "model.name=linreg",
                *_common(20, 100, 10),
                "algorithm.lr=0.05",
            ],
            tune_rounds=0,
            gammas=(0.05,),
            ks=(5,),
        ),
    }
    if path is not None:
        task, model = _libsvm_task(path)
        out["libsvm"] = Problem(
            "libsvm",
            [
                "dataset.name=libsvm",
                f"dataset.path={path}",
                "dataset.sparse=true",
                f"dataset.task={task}",
                "dataset.test_fraction=0.1",
                "partition.name=categories",
                "partition.category=kmeans",
                f"model.name={model}",
                *_common(200, 32, 100),
            ],
            tune_rounds=50,
            eval_every=5,
        )
    if opts.data_dir is not None:
        out["mnist"].overrides.append(f"dataset.data_dir={opts.data_dir}")
    return out


def _libsvm_task(path: str) -> tuple[str, str]:
    """(task, model) from the file's labels: two classes → logistic, otherwise regression."""
    from fedhp.data.sources import read_libsvm

    labels = {float(v) for v in read_libsvm(path)[2]}
    return ("classification", "logreg") if len(labels) == 2 else ("regression", "linreg")


RunSpec = tuple[str, float, int, int, int]
"""(method, γ, K, rounds, eval_every) of one run."""


def _folder(runs: Path, stage: str, spec: RunSpec) -> Path:
    method, gamma, k = spec[:3]
    return runs / stage / f"{method}-g{gamma:g}-K{k}"


def _overrides(opts: ReproOptions, prob: Problem, spec: RunSpec) -> list[str]:
    method, gamma, k, rounds, every = spec
    return [
        *prob.overrides,
        f"algorithm.name={method}",
        f"algorithm.lr={gamma}",
        f"rounds={rounds}",
        f"eval_every={every}",
        f"threads={opts.threads}",
        *([] if method == "diht" else [f"algorithm.local_steps={k}"]),
        *opts.extra,
    ]


def _prefetch(
    opts: ReproOptions, prob: Problem, runs: Path, stage: str, specs: list[RunSpec]
) -> None:
    """Run ``specs`` (``--jobs`` at once); later :func:`_run` calls reuse the finished runs."""
    tasks = list({_folder(runs, stage, s): _overrides(opts, prob, s) for s in specs}.items())
    for _ in map_runs([(ov, folder) for folder, ov in tasks], opts.jobs):
        pass


def _run(
    opts: ReproOptions, prob: Problem, runs: Path, stage: str, spec: RunSpec
) -> list[dict[str, float]]:
    """One run (reused if done before); its metrics rows (empty if it diverged at once)."""
    folder = _folder(runs, stage, spec)
    run_config(_overrides(opts, prob, spec), folder)
    return read_metrics(folder)


def final_objective(rows: list[dict[str, float]], rounds: int) -> float:
    """The objective at round ``rounds`` (``inf`` if the run stopped before it or diverged)."""
    last = [r for r in rows if int(r.get("round", 0)) == rounds and "objective" in r]
    value = last[0]["objective"] if last else math.inf
    return value if math.isfinite(value) else math.inf


def tune(opts: ReproOptions, prob: Problem, runs: Path) -> dict[str, dict[str, dict[str, float]]]:
    """method -> f"{γ:g}" -> f"{K}" -> final objective after ``tune_rounds`` rounds."""
    grid: dict[str, dict[str, dict[str, float]]] = {}
    specs = [
        (method, gamma, k, prob.tune_rounds, prob.tune_rounds)
        for method in METHODS
        for gamma in prob.gammas
        for k in ((1,) if method == "diht" else prob.ks)
    ]
    _prefetch(opts, prob, runs, "tune", specs)
    for spec in specs:
        method, gamma, k = spec[:3]
        value = final_objective(_run(opts, prob, runs, "tune", spec), prob.tune_rounds)
        grid.setdefault(method, {}).setdefault(f"{gamma:g}", {})[str(k)] = value
        log(opts, f"tune {prob.name} {method} γ={gamma:g} K={k}: {value:.6g}")
    return grid


def best_k(cells: dict[str, float]) -> tuple[int, float]:
    """The K with the lowest objective (ties: the smaller K) and that objective."""
    k, value = min(cells.items(), key=lambda kv: (kv[1], int(kv[0])))
    return int(k), value


def choose(grid: dict[str, dict[str, dict[str, float]]], f0: float) -> dict[str, Any]:
    """The shared γ (with each method's best K there) and each method's own best (γ, K).

    A γ is *stable* when every method with every K of the grid ends below f(x₀) = ``f0``; the
    shared γ is the stable one with the smallest Σ_m log(f_m(γ) / min_γ' f_m(γ')) (if none is
    stable: the smallest score over all γ)."""
    best = {
        m: min(((float(g), *best_k(cells)) for g, cells in grid[m].items()), key=lambda t: t[2])
        for m in METHODS
    }
    scores, stable = {}, []
    for g in grid[METHODS[0]]:
        parts = [best_k(grid[m][g])[1] / best[m][2] for m in METHODS]
        ok = all(math.isfinite(p) and p > 0 for p in parts)
        scores[g] = sum(math.log(p) for p in parts) if ok else math.inf
        if all(v < f0 for m in METHODS for v in grid[m][g].values()):
            stable.append(g)
    shared = min(stable or scores, key=lambda g: (scores[g], -float(g)))
    return {
        "initial_objective": f0,
        "stable_gammas": [float(g) for g in stable],
        "shared_gamma": float(shared),
        "shared_k": {m: best_k(grid[m][shared])[0] for m in METHODS},
        "shared_scores": scores,
        "tuned": {m: {"gamma": best[m][0], "K": best[m][1]} for m in METHODS},
    }


def initial_objective(prob: Problem) -> float:
    """f(x₀) = f(0) of the problem's training data."""
    import torch

    from fedhp.build import build_experiment
    from fedhp.config import resolve_config
    from fedhp.engine.runner import evaluate_state

    exp = build_experiment(resolve_config(None, [*prob.overrides, "algorithm.name=diht"]))
    row, _ = evaluate_state(exp, {"global": torch.zeros(exp.model.num_params)})
    return float(row["objective"])


def rounds_to(rows: list[dict[str, float]], target: float) -> int | None:
    """First round whose objective is ≤ ``target`` (None: never)."""
    for r in rows:
        if r.get("objective", math.inf) <= target:
            return int(r["round"])
    return None


def recovery_of(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Final support precision/recall and ‖x − x*‖; first rounds with ‖x − x*‖ ≤ 1e-3, 1e-6."""
    if not rows:
        return {}
    keys = ("support_precision", "support_recall", "dist_to_true", "support_size")
    out: dict[str, Any] = {k: rows[-1][k] for k in keys if k in rows[-1]}
    for tol in (1e-3, 1e-6):
        hit = [int(r["round"]) for r in rows if r.get("dist_to_true", math.inf) <= tol]
        if "dist_to_true" in rows[-1]:
            out[f"first_round_dist_le_{tol:g}"] = hit[0] if hit else None
    return out


def sim_time(rounds: int, k: int) -> float:
    """Simulated seconds of ``rounds`` rounds with ``k`` local steps each."""
    return rounds * (COMM_S + k * STEP_S)


def compare(
    opts: ReproOptions, prob: Problem, runs: Path, settings: dict[str, tuple[float, int]], tag: str
) -> tuple[dict[str, list[dict[str, float]]], list[dict[str, Any]]]:
    """Full runs of the three methods at ``settings`` (method -> (γ, K)) and their table rows."""
    curves = {}
    for m in METHODS:
        curves[m] = _run(opts, prob, runs, "full", (m, *settings[m], prob.rounds, prob.eval_every))
    base = [r for r in curves["diht"] if int(r["round"]) == prob.target_round]
    target = base[0]["objective"] if base else math.inf
    rows = []
    for m in METHODS:
        gamma, k = settings[m]
        hit = rounds_to(curves[m], target)
        objective = final_objective(curves[m], prob.rounds)
        t = sim_time(hit, k) if hit is not None else math.inf
        rows.append(
            {
                "method": m,
                "gamma": gamma,
                "K": k,
                "target": target,
                "rounds_to_target": hit,
                "sim_time_to_target_s": t,
                "objective_final": objective,
            }
        )
        print(
            f"fedht {tag} {m} rounds_to_target={hit if hit is not None else 'never'} "
            f"objective_final={objective:.6g} sim_time_to_target_s={t:.4g}",
            flush=True,
        )
    return curves, rows


def _series(rows: list[dict[str, float]], scale: float = 1.0) -> tuple[list[float], list[float]]:
    """(round × ``scale``, objective) of a run."""
    pts = [(r["round"] * scale, r["objective"]) for r in rows if "objective" in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def figures(
    out: Path,
    prob: Problem,
    curves: dict[str, list[dict[str, float]]],
    settings: dict[str, tuple[float, int]],
    k_curves: dict[str, list[dict[str, float]]],
    gamma: float,
) -> list[str]:
    """Objective vs rounds, vs local iterations, vs simulated time; the effect of K."""
    title = f"{prob.name}: γ={gamma:g}"
    label = {m: f"{LABELS[m]} (K={settings[m][1]})" for m in METHODS}
    by_round = {label[m]: _series(curves[m]) for m in METHODS}
    by_iter = {label[m]: _series(curves[m], settings[m][1]) for m in METHODS}
    by_time = {label[m]: _series(curves[m], COMM_S + settings[m][1] * STEP_S) for m in METHODS}
    files = {
        "objective_rounds.png": (by_round, "communication rounds"),
        "objective_iterations.png": (by_iter, "local iterations (rounds × K)"),
        "objective_time.png": (by_time, "simulated time (s): 150 ms/round + 20 µs/step"),
        "effect_of_k.png": ({k: _series(v) for k, v in k_curves.items()}, "communication rounds"),
    }
    for name, (series, xlabel) in files.items():
        plot_curves(series, out / name, xlabel, "training objective f(x)", title, logy=True)
    return list(files)


REC_KEYS = (
    "support_precision",
    "support_recall",
    "dist_to_true",
    "first_round_dist_le_0.001",
    "first_round_dist_le_1e-06",
)


def _cell(value: Any) -> str:
    if value is None:
        return "never"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def reproduce(opts: ReproOptions, name: str) -> dict[str, Any]:
    """Run the experiment ``name`` (sim1, sim2, mnist, libsvm, noiseless)."""
    start = time.perf_counter()
    if name == "libsvm" and opts.path is None:
        raise ConfigError("fedht-libsvm: --path is required (a LibSVM file, e.g. E2006.test)")
    if opts.path is not None and not Path(opts.path).is_file():
        raise ConfigError(f"--path: LibSVM file {opts.path} does not exist")
    prob = problems(opts, opts.path)[name]
    if opts.rounds_given:
        prob.rounds = opts.rounds
        prob.target_round = min(prob.target_round, opts.rounds)
        prob.tune_rounds = min(prob.tune_rounds, opts.rounds)
    out, runs = opts.folders(f"fedht-{name}")
    out.mkdir(parents=True, exist_ok=True)
    if prob.tune_rounds:
        grid = tune(opts, prob, runs)
        chosen = choose(grid, initial_objective(prob))
    else:
        grid = {}
        chosen = {"shared_gamma": prob.gammas[0], "shared_k": {m: prob.ks[0] for m in METHODS}}
    if opts.gamma is not None:  # --gamma: this common γ instead of the rule's choice
        chosen["shared_gamma"] = opts.gamma
        cells = {m: grid.get(m, {}).get(f"{opts.gamma:g}") for m in METHODS}
        chosen["shared_k"] = {m: best_k(c)[0] if c else max(prob.ks) for m, c in cells.items()}
    gamma = chosen["shared_gamma"]
    shared = {m: (gamma, 1 if m == "diht" else chosen["shared_k"][m]) for m in METHODS}
    full = [(m, *shared[m]) for m in METHODS]
    full += [(m, gamma, k) for m in ("fedht", "fediterht") for k in prob.ks]
    tuned = {m: (v["gamma"], v["K"]) for m, v in chosen.get("tuned", {}).items()}
    full += [(m, *tuned[m]) for m in tuned]
    _prefetch(opts, prob, runs, "full", [(*f, prob.rounds, prob.eval_every) for f in full])
    curves, rows = compare(opts, prob, runs, shared, name)
    k_curves = {}
    for m in ("fedht", "fediterht"):
        for k in prob.ks:
            spec = (m, gamma, k, prob.rounds, prob.eval_every)
            k_curves[f"{LABELS[m]} K={k}"] = _run(opts, prob, runs, "full", spec)
    files = figures(out, prob, curves, shared, k_curves, gamma)
    tuned_rows: list[dict[str, Any]] = []
    if tuned:
        tuned_curves, tuned_rows = compare(opts, prob, runs, tuned, f"{name}-tuned")
        plot_curves(
            {
                f"{LABELS[m]} (γ={tuned[m][0]:g}, K={tuned[m][1]})": _series(tuned_curves[m])
                for m in METHODS
            },
            out / "objective_rounds_tuned.png",
            "communication rounds",
            "training objective f(x)",
            f"{name}: each method at its own best γ",
            logy=True,
        )
        files.append("objective_rounds_tuned.png")
    recovery = {m: recovery_of(curves[m]) for m in METHODS}
    seconds = time.perf_counter() - start
    header = [
        "comparison",
        "method",
        "γ",
        "K",
        "rounds to target",
        "sim. time to target (s)",
        "final objective",
    ]
    table_rows = [
        [
            tag,
            LABELS[r["method"]],
            f"{r['gamma']:g}",
            str(r["K"]),
            str(r["rounds_to_target"] if r["rounds_to_target"] is not None else "never"),
            f"{r['sim_time_to_target_s']:.3f}",
            f"{r['objective_final']:.6g}",
        ]
        for tag, rs in (("shared γ", rows), ("tuned per method", tuned_rows))
        for r in rs
    ]
    rec_rows = [
        [LABELS[m], *(_cell(recovery[m].get(k, "—")) for k in REC_KEYS)]
        for m in METHODS
        if any(k in recovery[m] for k in REC_KEYS)  # none without a true x* (MNIST, LibSVM)
    ]
    text = (
        f"### fedht-{name}\n\nTarget: Distributed-IHT's objective at round {prob.target_round} "
        f"of the shared-γ run ({rows[0]['target']:.6g}); {prob.rounds} rounds; "
        f"torch threads = {opts.threads} (machine: {os.cpu_count()} CPUs); "
        f"wall time {seconds:.0f} s. {inputs_text(name, opts.extra)}".rstrip()
        + overrides_text(opts.extra)
        + "\n\n"
        + markdown_table(header, table_rows)
    )
    if rec_rows:
        text += "\nSupport recovery of the shared-γ runs (final round):\n\n"
        text += markdown_table(["method", *REC_KEYS], rec_rows)
    write_json_atomic(out / "tuning.json", {"grid": grid, "chosen": chosen})
    table = {
        "experiment": name,
        "rows": rows,
        "tuned_rows": tuned_rows,
        "recovery": recovery,
        "chosen": chosen,
        "figures": files,
        "seconds": seconds,
        "markdown": text,
    }
    write_table(out, table)
    return table
