"""The Python API: :func:`run` an experiment, :func:`load_run` a results folder.

Both go through the command line's code path: :func:`run` resolves the configuration with
:func:`fedhp.config.resolve_config`, runs it with :func:`run_built` (what ``fedhp run`` calls) and
reads the results back with :func:`load_run`, so a run from Python and ``fedhp run`` with the same
configuration give the same numbers and the same folder::

    import fedhp

    result = fedhp.run(rounds=3, threads=1, algorithm={"name": "fedavg"}, model__name="mlr")
    result.summary["final_global_acc"]       # summary.json
    result.metrics[-1]["global_acc"]         # metrics.csv, one dict per evaluated round
    result.column("global_acc")              # the column as a list
    result.state["global"]                   # final_state.pt: the algorithm's tensors
    fedhp.load_run(result.out_dir)           # the same Result, read back later
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fedhp.errors import ConfigError, DivergenceError, FedhpWarning

if TYPE_CHECKING:
    import torch

    from fedhp.config import RunConfig
    from fedhp.engine.experiment import Experiment

Row = dict[str, Any]


def _read_csv(path: Path) -> list[Row]:
    from fedhp.reporting import read_rows

    return read_rows(path) if path.is_file() else []


@dataclass
class Result:
    """One run's results: what its folder holds, as Python data.

    ``metrics``: metrics.csv, one dict per evaluated round (``round``, accuracies, losses, bytes);
    ``per_client``: per_client.csv rows; ``summary``: summary.json; ``config``: the resolved
    configuration (config.yaml); ``out_dir``: the run folder (None for ``fedhp.run(save=False)``).
    ``state`` (final_state.pt: the algorithm's final tensors, e.g. ``state["global"]``) is read
    on first use."""

    metrics: list[Row]
    summary: Row
    config: dict[str, Any]
    per_client: list[Row] = field(default_factory=list)
    out_dir: Path | None = None
    _state: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def state(self) -> dict[str, torch.Tensor]:
        """The final algorithm state (empty if the run stopped before writing it)."""
        if self._state is None:
            path = None if self.out_dir is None else self.out_dir / "final_state.pt"
            self._state = {}
            if path is not None and path.is_file():
                import torch

                self._state = torch.load(path, map_location="cpu", weights_only=True)["state"]
        return self._state

    def column(self, name: str) -> list[Any]:
        """``metrics[i][name]`` for every evaluated round that has it."""
        return [row[name] for row in self.metrics if name in row]


def load_run(out_dir: str | Path) -> Result:
    """The results in ``out_dir`` (a folder written by ``fedhp run`` or :func:`run`)."""
    folder = Path(out_dir)
    summary_path = folder / "summary.json"
    if not (folder / "config.yaml").is_file() or not summary_path.is_file():
        raise ConfigError(
            f"{folder}: not a finished fedhp run (needs config.yaml and summary.json; "
            f"an interrupted run continues with `fedhp run --resume {folder}`)"
        )
    return Result(
        metrics=_read_csv(folder / "metrics.csv"),
        summary=json.loads(summary_path.read_text()),
        config=yaml.safe_load((folder / "config.yaml").read_text()),
        per_client=_read_csv(folder / "per_client.csv"),
        out_dir=folder,
    )


def prepare(cfg: RunConfig) -> Experiment:
    """Check the backend's constraints, then load the data and build the run."""
    from fedhp.build import build_experiment

    if cfg.tensorboard:
        from fedhp.tensorboard import require

        require()
    if cfg.mlflow.enabled:
        from fedhp.mlflow_tracking import require as require_mlflow

        require_mlflow()
    if cfg.backend != "inprocess":
        from fedhp.algorithms import ALGORITHMS
        from fedhp.flower.shards import check_flower_config

        check_flower_config(cfg, ALGORITHMS.build(cfg.algorithm, "algorithm"))
    exp = build_experiment(cfg)
    if cfg.eval_split == "val" and int(exp.ctx.fed.val.counts.sum()) == 0:
        raise ConfigError(
            "eval_split: val, but the partition gave no client validation data; set "
            "partition.val_per_class (or val_fraction) above 0, or eval_split=test"
        )
    note = batch_size_note(exp)
    if note is not None:
        warnings.warn(note, FedhpWarning, stacklevel=2)
    return exp


def batch_size_note(exp: Experiment) -> str | None:
    """What happens to clients with fewer training samples than ``algorithm.batch_size`` (None:
    every client has enough). The engine keeps the batch size: under ``local_steps`` their
    minibatches repeat their samples to ``batch_size`` rows, under ``local_epochs`` their one
    step per epoch is padded to ``batch_size`` rows; either way a step costs ``batch_size``
    rows."""
    from fedhp.algorithms.base import local_epochs_of

    batch = getattr(exp.options, "batch_size", None)
    if not isinstance(batch, int):
        return None
    counts = exp.ctx.fed.train.counts
    small = int((counts < batch).sum())
    if small == 0:
        return None
    smallest = int(counts.min())
    if local_epochs_of(exp.options) is None:
        what = f"their minibatches repeat their samples to fill {batch} rows"
    else:
        what = f"their one step per epoch is padded to {batch} rows"
    return (
        f"algorithm.batch_size={batch} exceeds the training samples of {small} of "
        f"{len(counts)} clients (smallest: {smallest}): {what}, and each step costs {batch} rows; "
        f"set algorithm.batch_size={smallest} or less to avoid that"
    )


def check_out_dir(
    out: Path, overwrite: bool = False, create: bool = True, flag: str = "--out"
) -> None:
    """One-line errors for a results folder the run must not or cannot write: a file, a folder
    holding a fedhp run (unless ``overwrite``), a non-empty folder that is not a run (unless
    ``overwrite``), a folder that cannot be created or written. ``create``: make the folder
    (else only check that the nearest existing folder above it is writable: ``--check``)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{flag} {out}: is a file, not a folder; name a folder for the results")
    if out.is_dir() and not overwrite:
        if (out / "config.yaml").is_file():
            raise ConfigError(
                f"{flag} {out}: holds a fedhp run already; add --overwrite to replace it, "
                f"continue it with `fedhp run --resume {out}`, or name another folder"
            )
        if any(out.iterdir()):
            raise ConfigError(
                f"{flag} {out}: is not empty and holds no fedhp run; name a new or empty folder "
                "(or add --overwrite to write the results among its files)"
            )
    if not create:
        above = out
        while not above.exists() and above != above.parent:
            above = above.parent
        if not above.is_dir() or not os.access(above, os.W_OK | os.X_OK):
            raise ConfigError(
                f"{flag} {out}: cannot be written ({above} is not a writable folder); "
                "name a folder you can write to"
            )
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".fedhp-write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise ConfigError(
            f"{flag} {out}: cannot be written ({err.strerror or err}); "
            "name a folder you can write to"
        ) from None


class FreshFolder:
    """The results folder of a new run, removed again when the start fails (an error, a crash,
    Ctrl-C; not a divergence, whose results are kept) before its first round finishes, so the
    same command works once the cause is fixed. Only what the failed start wrote goes: a folder
    it created is removed (with the folders above it that it created, where they stayed empty),
    a folder that was empty before is emptied again, any other folder is left as it is. Make it
    before :func:`check_out_dir` creates the folder; pass :meth:`on_round` to
    :func:`run_built`."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.rounds = 0
        top: Path | None = None  # the highest folder of the path that does not exist yet
        path = out.absolute()
        while not path.exists() and path != path.parent:
            top, path = path, path.parent
        self.top = top
        self.was_empty = out.is_dir() and not any(out.iterdir())

    def on_round(self, rounds_done: int) -> None:
        """Called after every finished round."""
        self.rounds = rounds_done

    def discard(self) -> bool:
        """Remove what the start wrote if no round finished (the folder itself where the start
        created it); whether it did."""
        if self.rounds > 0 or not self.out.is_dir():
            return False
        if self.top is None:
            if not self.was_empty:
                return False
            for entry in self.out.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
            return not any(self.out.iterdir())
        shutil.rmtree(self.out, ignore_errors=True)
        path = self.out.absolute()
        while path != self.top:
            path = path.parent
            try:
                path.rmdir()  # (only while empty)
            except OSError:
                break
        return not self.out.exists()


def run_built(
    exp: Experiment,
    out_dir: Path | None,
    resume: bool = False,
    progress: bool | None = None,
    on_round: Callable[[int], None] | None = None,
) -> Row:
    """Run a built experiment on its configured backend; returns the summary (``fedhp run``).
    ``on_round(rounds_done)`` is called after every finished round."""
    if exp.cfg.backend == "flower-sim":
        from fedhp.flower.simulation import run_flower_sim

        return run_flower_sim(exp, out_dir, progress=progress, resume=resume, on_round=on_round)
    from fedhp.engine.runner import run_experiment

    return run_experiment(exp, out_dir, progress=progress, resume=resume, on_round=on_round)


def default_out_dir(cfg: RunConfig) -> Path:
    """``runs/<algorithm>-<dataset>-<timestamp>`` (the folder ``fedhp run`` picks)."""
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{cfg.algorithm.get('name')}-{cfg.dataset.get('name')}-{stamp}"


def _flatten(prefix: str, value: Any) -> list[str]:
    """``key=value`` overrides (values as YAML) from a possibly nested mapping."""
    if isinstance(value, Mapping):
        out: list[str] = []
        for key, sub in value.items():
            out += _flatten(f"{prefix}.{key}", sub)
        return out
    text = yaml.safe_dump(value, default_flow_style=True)
    text = text.removesuffix("...\n").strip()  # a scalar's document-end marker
    return [f"{prefix}={text}"]


def overrides_from_kwargs(kwargs: Mapping[str, Any]) -> list[str]:
    """``rounds=3, algorithm__lr=0.1, model={"name": "mlr"}`` → ``key=value`` overrides
    (``__`` or ``.`` separate nested keys; a mapping sets each of its keys)."""
    out: list[str] = []
    for key, value in kwargs.items():
        out += _flatten(key.replace("__", "."), value)
    return out


def refuse_sweep_file(path: Path | None) -> None:
    """A YAML file with a ``sweep:`` section is a sweep: a one-line error pointing to
    ``fedhp sweep`` (``fedhp run`` and :func:`run` take one run's options)."""
    from fedhp.config import load_yaml

    if path is not None and path.is_file() and "sweep" in load_yaml(path):
        raise ConfigError(
            f"{path}: has a sweep: section (a grid of runs); run it with `fedhp sweep {path}` "
            "(or fedhp.sweep(...)); fedhp run takes one run's options"
        )


def _check_types(config: Any, plugins: Any, out: Any = None) -> None:
    """:func:`run` / :func:`resolve` arguments of the wrong type: a one-line
    :class:`ConfigError` naming the argument (not a ``TypeError`` from deep inside)."""
    from fedhp.config import RunConfig

    if config is not None and not isinstance(config, RunConfig | str | Path | Mapping):
        raise ConfigError(
            f"config: expected a YAML file (str or Path), a mapping of options, a RunConfig or "
            f"None; got {type(config).__name__} {config!r}"
        )
    if isinstance(plugins, str) or not all(isinstance(p, str | Path) for p in plugins):
        raise ConfigError("plugins: expected a list of files or modules, e.g. ['my_plugin.py']")
    if out is not None and not isinstance(out, str | Path):
        raise ConfigError(f"out: expected a folder name (str or Path); got {type(out).__name__}")


def resolve(
    config: RunConfig | str | Path | Mapping[str, Any] | None = None,
    plugins: Sequence[str] = (),
    **overrides: Any,
) -> RunConfig:
    """The validated configuration :func:`run` would use (nothing is loaded or run)."""
    from fedhp.config import RunConfig, resolve_config

    _check_types(config, plugins)
    items = overrides_from_kwargs(overrides)
    if isinstance(config, RunConfig):
        # The options as given (not config_to_dict's full form): an override such as
        # local_epochs then replaces the unset local_steps instead of clashing with it.
        base = config.model_dump(mode="json")
        return resolve_config(None, items, base=base, plugins=plugins)
    if isinstance(config, Mapping):
        mapping = {k: v for k, v in config.items() if k != "plugins"}
        listed = config.get("plugins") or []
        items = [*overrides_from_kwargs(mapping), *items]
        return resolve_config(None, items, plugins=[*listed, *plugins])
    path = Path(config) if config is not None else None
    refuse_sweep_file(path)
    return resolve_config(path, items, plugins=plugins)


def run(
    config: RunConfig | str | Path | Mapping[str, Any] | None = None,
    *,
    out: str | Path | None = None,
    save: bool = True,
    overwrite: bool = False,
    plugins: Sequence[str] = (),
    **overrides: Any,
) -> Result:
    """Run one experiment, as ``fedhp run`` does, and return its :class:`Result`.

    ``config``: a YAML file, a mapping (laid over the defaults like a YAML file), a
    :class:`~fedhp.config.RunConfig`, or None for the defaults. ``overrides``: options as keyword
    arguments (``rounds=3``, ``algorithm__lr=0.1`` or ``**{"algorithm.lr": 0.1}``,
    ``algorithm={"name": "fedavg", "lr": 0.1}``). ``plugins``: files or modules registering your
    own components (docs/extending.md). ``out``: the run folder (default
    ``runs/<algorithm>-<dataset>-<time>``; a folder holding a run is refused unless
    ``overwrite``); ``save=False`` keeps nothing on disk (the results are read from a temporary
    folder, then deleted). Errors are :class:`fedhp.errors.FedhpError` with one-line
    messages."""
    _check_types(config, plugins, out)
    cfg = resolve(config, plugins, **overrides)
    folder = Path(out) if out is not None else default_out_dir(cfg)
    if not save:
        exp = prepare(cfg)
        tmp = Path(tempfile.mkdtemp(prefix="fedhp-run-"))
        try:
            run_built(exp, tmp)
            result = load_run(tmp)
            _ = result.state  # read before the folder goes
            result.out_dir = None
            return result
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    fresh = FreshFolder(folder)
    check_out_dir(folder, overwrite, flag="out")
    try:
        run_built(prepare(cfg), folder, on_round=fresh.on_round)
    except DivergenceError:
        raise  # (its results are kept)
    except BaseException:
        fresh.discard()  # a failed start leaves no folder that blocks the next try
        raise
    return load_run(folder)
