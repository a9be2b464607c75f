"""``robust-paper``: Karimireddy, He and Jaggi's MNIST experiment in fedhp (issue 41).

The setting of "Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing" (ICLR 2022),
experiment 3 of its code (epfml/byzantine-robust-noniid-optimizer, ``exp3.py``, ``utils.py``,
``run.sh``), as closely as fedhp allows:

* 25 workers, 5 of them Byzantine (FedAvg, every client in every round, uniform weights).
* Their non-IID split: the 20 good workers hold the MNIST training set sorted by label and cut
  into 20 contiguous chunks of 3,000; the Byzantine workers hold IID samples (3,000 each, drawn
  from the whole training set). Partition ``label_sorted`` (a built-in partitioner,
  ``partition.iid_clients=5``), with the Byzantine workers the first 5 clients (one edge,
  ``placement=concentrated``). The test set is dealt evenly at random over the clients, so the
  global accuracy is the whole 10,000-image test set's.
* One SGD step per round (``algorithm.local_steps=1``), batch 32, lr 0.01. The upload minus the
  start is ``-lr·g``, so every rule here, applied to updates, is the rule on the gradients
  scaled by ``-lr`` (scale-equivariant with the thresholds below scaled by ``lr``).
* Worker momentum β ∈ {0, 0.9}. Their workers keep PyTorch's buffer ``m ← βm + g``; fedhp's
  ``algorithm.client_momentum`` keeps ``m ← βm + (1 − β)u``. With ``u = -lr'·g`` and
  ``lr' = lr/(1 − β)`` (0.1 at β = 0.9) fedhp's momentum is ``-lr`` times their buffer, exactly
  (both start at the first gradient's size): a round takes their iteration's step.
* Attacks (20 %): BF = ``sign_flip`` scale 1 (and, at β = 0.9, ``BF-scaled``: scale 1 − β, see
  :data:`SCALED`); LF = ``label_flip`` (y → 9 − y); IPM ε = 0.1;
  ALIE with their z = Φ⁻¹((n − f − s)/(n − f)), s = ⌊n/2 + 1⌋ − f (0.2533 for n = 25, f = 5;
  fedhp's default z_max uses Baruch's (n − s)/n, 0.4677). Mimic is not an attack of fedhp: not
  run.
* Rules: Krum (f = 5, m = 1), CM = coordinate-wise median, RFA = geometric median (8 smoothed
  Weiszfeld iterations, ν = 0.1·lr, no early stop), CClip (τ = 10·lr, 3 iterations, centre =
  the previous aggregate), each with bucketing s ∈ {none, 2}; the mean, attack-free and under
  each attack, as the reference.

Deviations (also in docs/robustness-paper.md): the model is fedhp's DNN 784-100-10 (theirs a
1.2M-parameter CNN with dropout: 0.27 s per worker step on one CPU thread, an hour per run;
``--model cnn`` runs McMahan et al.'s CNN instead); in fedhp the Byzantine BF and LF workers
forge their uploads from their own momentum (theirs send plain gradients); RFA starts from the
mean (theirs from 0); the Byzantine workers' IID samples are fixed for the run (theirs are
redrawn each epoch); no mimic attack. Their 600 rounds (20 epochs of 30 batches, evaluated after
each; ``--eval-every`` is not read) by default, one seed (``--seeds`` for more; theirs 3): about
25 minutes per seed on one CPU thread of a 2-core machine.

Prints the trivial baseline (11.35 %: MNIST's majority class), then ``robust-paper <attack>
<rule> s=<s> beta=<β> acc=<final> last5=<mean of the last 5 evaluations>`` per result (``▼`` at
or below the trivial baseline); writes ``table.md`` / ``table.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError
from fedhp.experiments.common import (
    MODELS,
    ReproOptions,
    machine,
    markdown_table,
    mean_std,
    run_seeds,
    run_tail,
    write_study,
)
from fedhp.experiments.figures import read_metrics

WORKERS, BYZANTINE, BATCH, LR = 25, 5, 32, 0.01
ROUNDS, QUICK_ROUNDS, EVAL_EVERY, QUICK_EVAL_EVERY = 600, 40, 30, 10
"""Their 600 iterations are 20 epochs of 30 batches, evaluated after each epoch."""
ALIE_Z = 0.2533471031357997
"""Φ⁻¹(0.6): their ALIE z for n = 25, f = 5 (``codes/attacks/alittle.py``)."""
CCLIP_TAU, CCLIP_ITERS, RFA_ITERS, RFA_NU, KRUM_F = 10.0 * LR, 3, 8, 0.1 * LR, BYZANTINE
TRIVIAL = 0.1135
"""MNIST's majority class (digit 1) on the test set: a constant predictor's accuracy."""
ATTACKS: dict[str, list[str]] = {
    "BF": ["faults.attack.name=sign_flip", "faults.attack.sign_scale=1"],
    "LF": ["faults.attack.name=label_flip"],
    "IPM": ["faults.attack.name=ipm", "faults.attack.epsilon=0.1"],
    "ALIE": ["faults.attack.name=alie", f"faults.attack.z={ALIE_Z}"],
    "BF-scaled": ["faults.attack.name=sign_flip"],  # scale 1 − β: see SCALED
}
SCALED = "BF-scaled"
"""Sign flip scaled by 1 − β, run at β > 0 only: their Byzantine BF worker sends its plain
gradient −g beside the good workers' undamped momenta (about g/(1 − β)); fedhp's sends its own
momentum, so BF at scale 1 is about 1/(1 − β) times stronger than theirs, BF-scaled about
theirs."""
RULES: dict[str, list[str]] = {
    "Krum": ["robust.cloud.name=krum", f"robust.cloud.f={KRUM_F}"],
    "CM": ["robust.cloud.name=median"],
    "RFA": [
        "robust.cloud.name=geomed",
        f"robust.cloud.max_iter={RFA_ITERS}",
        f"robust.cloud.nu={RFA_NU}",
        "robust.cloud.tol=0",
    ],
    "CClip": [
        "robust.cloud.name=cclip",
        f"robust.cloud.tau={CCLIP_TAU}",
        f"robust.cloud.clip_iters={CCLIP_ITERS}",
    ],
}
BUCKETS, MOMENTA = (0, 2), (0.0, 0.9)
"""Their s (0: no bucketing; fedhp's ``bucket: 1``) and β."""
QUICK_RULES, QUICK_ATTACKS = ("CM", "CClip"), ("BF", "ALIE")
MODEL_CHOICES = ("dnn", "mlr", "cnn")


@dataclass(frozen=True)
class Cell:
    """One run setting: ``rule`` (``Mean``: the attack-free reference), ``attack`` (``none``),
    bucket size ``s`` (0: none) and momentum ``beta``."""

    rule: str
    attack: str
    s: int
    beta: float

    @property
    def folder(self) -> str:
        return f"{self.rule}-{self.attack}-s{self.s}-m{self.beta:g}"

    def overrides(self) -> list[str]:
        """The rule's, the attack's, the bucket's and the momentum's overrides."""
        out = [*RULES.get(self.rule, [])]
        if self.s:
            out.append(f"robust.cloud.bucket={self.s}")
        if self.attack != "none":
            out += [
                *ATTACKS[self.attack],
                *([f"faults.attack.sign_scale={1.0 - self.beta:g}"] * (self.attack == SCALED)),
                f"faults.attack.fraction={BYZANTINE / WORKERS}",
                "faults.attack.placement=concentrated",
            ]
        lr = LR / (1.0 - self.beta)  # fedhp's damped momentum = -LR × their buffer
        out += [f"algorithm.lr={lr:g}", f"algorithm.client_momentum={self.beta:g}"]
        return out


def cells(opts: ReproOptions) -> list[Cell]:
    """The mean attack-free and under each attack (no bucketing), then every rule × attack × s,
    for each β (:data:`SCALED` only at β > 0; ``--quick``: CM and CClip under BF and ALIE)."""
    rules, attacks = (QUICK_RULES, QUICK_ATTACKS) if opts.quick else (tuple(RULES), tuple(ATTACKS))
    out = []
    for b in MOMENTA:
        these = [a for a in attacks if a != SCALED or b > 0]
        out += [Cell("Mean", a, 0, b) for a in ("none", *these)]
        out += [Cell(r, a, s, b) for r in rules for s in BUCKETS for a in these]
    return out


def rounds_of(opts: ReproOptions) -> int:
    return opts.rounds if opts.rounds_given else (QUICK_ROUNDS if opts.quick else ROUNDS)


def eval_every(opts: ReproOptions) -> int:
    """Their epoch (30 rounds), or every 10 rounds at ``--quick``; never beyond the rounds."""
    return min(QUICK_EVAL_EVERY if opts.quick else EVAL_EVERY, rounds_of(opts))


def check(opts: ReproOptions) -> str:
    """The model name; one-line errors for options this reproduction does not take."""
    if opts.dataset != "mnist":
        raise ConfigError(f"--dataset: robust-paper runs mnist (the paper's); got {opts.dataset!r}")
    model = opts.model or "dnn"
    if model not in MODEL_CHOICES:
        raise ConfigError(f"--model: robust-paper runs {', '.join(MODEL_CHOICES)}; got {model!r}")
    return model


def run_overrides(opts: ReproOptions, cell: Cell, seed: int) -> list[str]:
    """Every override of one run."""
    model = check(opts)
    return [
        "dataset.name=mnist",
        *([f"dataset.data_dir={opts.data_dir}"] if opts.data_dir else []),
        "partition.name=label_sorted",
        f"partition.iid_clients={BYZANTINE}",
        f"federation.num_clients={WORKERS}",
        "federation.num_edges=1",
        "federation.weighting=uniform",
        *MODELS[model],
        "algorithm.name=fedavg",
        "algorithm.local_steps=1",
        f"algorithm.batch_size={BATCH}",
        *cell.overrides(),
        f"rounds={rounds_of(opts)}",
        f"eval_every={eval_every(opts)}",
        "eval_train=false",
        "max_loss=null",
        *run_tail(opts, seed, 100),
    ]


def last_evaluations(folder: Path, k: int = 5) -> list[float]:
    """The last ``k`` global accuracies of a run's ``metrics.csv`` (none if it is missing)."""
    return [r["global_acc"] for r in read_metrics(Path(folder)) if "global_acc" in r][-k:]


def summarize(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Final and last-5 accuracies over seeds (mean, std, values), divergence and time."""
    finals = [float(s.get("final_global_acc", math.nan)) for s in summaries]
    last5 = []
    for s in summaries:
        tail = last_evaluations(Path(s.get("folder", ".")))
        last5.append(sum(tail) / len(tail) if tail else math.nan)
    acc, std = mean_std(finals)
    l5, l5_std = mean_std(last5)
    return {
        "acc": acc,
        "std": std,
        "accs": finals,
        "last5": l5,
        "last5_std": l5_std,
        "stopped": [s["stopped"] for s in summaries if s.get("stopped")],
        "seconds": sum(float(s.get("seconds", 0.0)) for s in summaries),
        "trivial": acc <= TRIVIAL + 1e-12,
    }


def result_line(cell: Cell, entry: dict[str, Any]) -> str:
    flag = " ▼" if entry["trivial"] else ""
    tail = " diverged" if entry["stopped"] else ""
    return (
        f"robust-paper {cell.attack} {cell.rule} s={cell.s} beta={cell.beta:g} "
        f"acc={entry['acc']:.4f} last5={entry['last5']:.4f}{flag}{tail}"
    )


def cell_text(entry: dict[str, Any] | None) -> str:
    """``acc (last5)`` in %, ± std over seeds when there are several; ▼ at/below trivial."""
    if entry is None:
        return "—"
    spread = f" ± {100 * entry['std']:.1f}" if len(entry["accs"]) > 1 else ""
    flag = " ▼" if entry["trivial"] else ""
    dagger = " †" if entry["stopped"] else ""
    return f"{100 * entry['acc']:.1f}{spread} ({100 * entry['last5']:.1f}){flag}{dagger}"


def tables(results: dict[Cell, dict[str, Any]]) -> str:
    """One table per β: the mean's row (attack-free and attacked), then a row per rule × s; a
    column per attack."""
    attacks = [a for a in ATTACKS if any(c.attack == a for c in results)]
    rules = [r for r in RULES if any(c.rule == r for c in results)]
    parts = []
    for beta in MOMENTA:
        mean = [results.get(Cell("Mean", a, 0, beta)) for a in ("none", *attacks)]
        body = [["Mean", "none", *(cell_text(e) for e in mean)]]
        for rule in rules:
            for s in BUCKETS:
                row = [results.get(Cell(rule, a, s, beta)) for a in attacks]
                body.append([rule, str(s) if s else "none", "", *(cell_text(e) for e in row)])
        header = ["rule", "bucketing s", "no attack", *attacks]
        parts.append(f"### β = {beta:g}\n\n" + markdown_table(header, body))
    return "\n".join(parts)


def describe(opts: ReproOptions, seeds: int, wall: float, runs: int) -> str:
    model = check(opts)
    return (
        f"MNIST, {WORKERS} workers of which {BYZANTINE} Byzantine (the first 5 clients, IID "
        f"samples); the 20 good ones hold the label-sorted training set in contiguous chunks. "
        f"FedAvg with 1 local SGD step per round, batch {BATCH}, lr {LR} (lr {LR}/(1 − β) with "
        f"client momentum β, the same steps as their undamped momentum), model {model}, "
        f"{rounds_of(opts)} rounds, evaluated every {eval_every(opts)} on the 10,000 test images. "
        f"Cells: final accuracy % (mean of the last 5 evaluations), seeds 0..{seeds - 1}"
        f"{' (mean ± std)' if seeds > 1 else ''}. Attacks at 20 %: BF = sign flip ×1, LF = "
        f"labels 9 − y, IPM ε = 0.1, ALIE z = {ALIE_Z:.4f}, BF-scaled = sign flip × (1 − β) (about "
        f"their BF's size next to undamped momenta; β > 0 only). Krum f = {KRUM_F}; CM = median; "
        f"RFA = geomed, {RFA_ITERS} iterations, ν = {RFA_NU:g}; CClip τ = {CCLIP_TAU:g} (their "
        f"10 × lr), L = {CCLIP_ITERS}. ▼: at or below the trivial baseline {100 * TRIVIAL:.2f} % "
        f"(majority class); † a run stopped on a non-finite loss. {runs} runs, {wall:.0f} s of "
        f"runs (torch threads {opts.threads}; {machine()})."
    )


def reproduce(opts: ReproOptions) -> dict[str, Any]:
    """Run (or reuse) every cell × seed, print the result lines, write the tables."""
    check(opts)
    if opts.methods is not None:
        raise ConfigError("--methods: robust-paper runs a fixed set of rules; drop --methods")
    out, runs = opts.folders(f"robust-paper-{'quick' if opts.quick else 'full'}")
    seeds = range(opts.seeds)
    grid = cells(opts)
    done = run_seeds(
        opts,
        grid,
        lambda cell, seed: run_overrides(opts, cell, seed),
        lambda cell: runs / cell.folder,
        lambda cell: cell.folder,
        seed_major=True,  # seed by seed: a cut-short run leaves whole seeds to reuse
    )
    print(f"robust-paper trivial baseline (majority class) acc={TRIVIAL:.4f}")
    results = {}
    for cell in grid:
        results[cell] = summarize(done[cell])
        print(result_line(cell, results[cell]), flush=True)
    wall = sum(e["seconds"] for e in results.values())
    description = describe(opts, len(seeds), wall, len(grid) * len(seeds))
    text = tables(results)
    data = {
        "quick": opts.quick,
        "rounds": rounds_of(opts),
        "seeds": len(seeds),
        "trivial": TRIVIAL,
        "description": description,
        "results": [
            {"rule": c.rule, "attack": c.attack, "s": c.s, "beta": c.beta, **e}
            for c, e in results.items()
        ],
    }
    return write_study(opts, out, description, text, data)
