"""Every option used or refused (issue 42; src/fedhp/unread.py).

The options a run reads are recorded while it resolves, builds and runs one tiny round: every
attribute read of a pydantic option object (the run's sections and the dataset, partition, model
and algorithm options) is logged by dotted key. In each scenario every option of every component
in play must be read or declared unread (``unread_options``), and none declared unread may be
read. The scenarios name every registered algorithm, dataset, partitioner and model, each attack,
robust rule and the other switches that make options read, so the declarations are checked
against what the code does, not against a separate run per option."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pydantic
import pytest

from fedhp.algorithms import ALGORITHMS
from fedhp.algorithms.fedavg import FedAvgOptions
from fedhp.config import COMPONENT_SECTIONS, RunConfig, resolve_config
from fedhp.data import DATASETS, PARTITIONERS
from fedhp.errors import ConfigError
from fedhp.models import MODELS
from fedhp.unread import component_registry, unread_options

TINY = [
    "progress=false",
    "threads=1",
    "rounds=1",
    "checkpoint_every=0",
    "eval_train=false",
    "federation.num_clients=8",
    "federation.num_edges=2",
    "model.name=mlr",
]
"""A tiny run: 8 clients on 2 edges, MLR, one round; on a subsample of MNIST, labels-partitioned
(:data:`MNIST`) where a scenario names no dataset or partition."""

MNIST = [
    "subsample.train=400",
    "subsample.test=100",
    "partition.train_per_class=8",
    "partition.test_per_class=4",
]
SMALL_MNIST = ["subsample.train=200", "subsample.test=100", "algorithm.name=fedavg"]
ONE_STEP = ["algorithm.name=fedavg", "algorithm.local_steps=1"]
SPARSE = ["dataset.num_clients=4", "federation.num_clients=4", "federation.num_edges=1"]
SPARSE_RUN = ["partition.name=natural", *SPARSE, "dataset.samples=20", "dataset.test_samples=10"]


def idx_dir(tmp: Path) -> list[str]:
    from tests.data.test_sources import write_idx_set

    write_idx_set(tmp / "fmnist", n_train=80, n_test=40)
    return ["dataset.name=fmnist", f"dataset.data_dir={tmp / 'fmnist'}", "partition.name=shards"]


def cifar_dir(tmp: Path) -> list[str]:
    from tests.data.test_sources import write_cifar

    write_cifar(tmp / "cifar", n=16)
    return ["dataset.name=cifar10", f"dataset.data_dir={tmp / 'cifar'}", "partition.name=shards"]


def libsvm_file(tmp: Path) -> list[str]:
    from tests.data.test_libsvm_sparse import write_libsvm

    write_libsvm(tmp / "rows.svm", 80, 12, 4, seed=0, regression=True)
    return [
        "dataset.name=libsvm",
        f"dataset.path={tmp / 'rows.svm'}",
        "partition.name=quantity",
        "partition.min_samples=2",
        "model.name=linreg",
        "algorithm.name=fedht",
        "max_loss=null",
    ]


def plays(tmp: Path) -> list[str]:
    from tests.data.shakespeare_play import write_plays

    write_plays(tmp / "plays")
    return [
        "dataset.name=shakespeare",
        f"dataset.data_dir={tmp / 'plays'}",
        "dataset.seq_len=8",
        "federation.num_clients=6",
        "model.name=lstm",
        "algorithm.name=fedavg",
        "algorithm.local_steps=1",
    ]


SCENARIOS: dict[str, list[str] | Callable[[Path], list[str]]] = {
    **{f"algorithm {n}": [f"algorithm.name={n}"] for n in ALGORITHMS.names()},
    # methods that need more than MLR on MNIST
    "algorithm fedper": ["algorithm.name=fedper", "model.name=dnn", "model.hidden=[8]"],
    "algorithm heterofl": ["algorithm.name=heterofl", "model.name=dnn", "model.hidden=[8]"],
    "algorithm fedrolex": ["algorithm.name=fedrolex", "model.name=dnn", "model.hidden=[8]"],
    "algorithm fedlps": ["algorithm.name=fedlps", "model.name=dnn", "model.hidden=[8]"],
    "algorithm lotteryfl": ["algorithm.name=lotteryfl", "model.name=dnn", "model.hidden=[8]"],
    "algorithm fnrfl": ["algorithm.name=fnrfl", "public.per_class=2"],
    "fnrfl adam, test leak": [
        "algorithm.name=fnrfl",
        "algorithm.refine_optimizer=adam",
        "algorithm.allow_test_leak=true",
        "algorithm.momentum=0.5",
        "algorithm.weight_decay=0.001",
        "public.per_class=2",
        "public.source=test",
    ],
    # options that other options switch on
    "local epochs": ["algorithm.name=fedavg", "algorithm.local_epochs=1"],
    "sfedhp sparse": [
        "algorithm.gamma1=0.001",
        "algorithm.gamma2=0.001",
        "algorithm.sparse_schedule=true",
        "algorithm.inner=nesterov",
        "algorithm.K=2",
        "algorithm.R=2",
    ],
    "pfedgp inducing": [
        "algorithm.name=pfedgp",
        "algorithm.inducing=true",
        "algorithm.inducing_points=2",
        "algorithm.chains=2",
        "algorithm.test_chains=2",
    ],
    # datasets, partitioners and models
    "fmnist": idx_dir,
    "cifar10": cifar_dir,
    "libsvm": libsvm_file,
    "shakespeare": plays,
    "synthetic": ["dataset.name=synthetic", "partition.name=natural", "dataset.num_clients=8"],
    "fedht_sim linreg": [
        "dataset.name=fedht_sim",
        "dataset.task=linear",
        "model.name=linreg",
        "algorithm.name=fedht",
        *SPARSE_RUN,
    ],
    "fedht_sim logreg": [
        "dataset.name=fedht_sim",
        "dataset.task=logistic",
        "dataset.positives=10",
        "model.name=logreg",
        "algorithm.name=fedht",
        *SPARSE_RUN,
    ],
    "gaussian_sparse linreg": [
        "dataset.name=gaussian_sparse",
        "model.name=linreg",
        "algorithm.name=fediterht",
        *SPARSE_RUN,
    ],
    "model softmax": ["model.name=softmax", *ONE_STEP],
    **{
        f"partition {p}": [f"partition.name={p}", *SMALL_MNIST]
        for p in ("shards", "feature_noise", "mixed")
    },
    **{
        f"partition {p}": [f"partition.name={p}", "partition.min_samples=2", *SMALL_MNIST]
        for p in ("dirichlet", "quantity")
    },
    "partition label_sorted": [
        "partition.name=label_sorted",
        "partition.iid_clients=1",
        *SMALL_MNIST,
    ],
    "partition quantity lognormal": [
        "partition.name=quantity",
        "partition.distribution=lognormal",
        "partition.min_samples=2",
        *SMALL_MNIST,
    ],
    "natural val_tail": [
        "dataset.name=synthetic",
        "dataset.num_clients=8",
        "partition.name=natural",
        "partition.val_tail=true",
        "partition.val_fraction=0.2",
        "partition.val_gap=1",
    ],
    "partition val": ["partition.val_fraction=0.2", "partition.val_stratified=true", *MNIST],
    "partition categories": [
        "partition.name=categories",
        "federation.num_clients=10",
        *SMALL_MNIST,
    ],
    "partition categories kmeans": [
        "partition.name=categories",
        "partition.category=kmeans",
        "federation.num_clients=10",
        *SMALL_MNIST,
    ],
    **{f"model {m}": [f"model.name={m}", *ONE_STEP] for m in ("dnn", "cnn", "cnn2")},
    "model resnet18": [
        "model.name=resnet18",
        *ONE_STEP,
        "algorithm.batch_size=2",
        "federation.num_clients=2",
        "federation.num_edges=1",
        "subsample.train=40",
        "subsample.test=10",
        "partition.name=shards",
        "eval_every=1",
    ],
    "model vgg": ["model.name=vgg", "model.cfg=[4, M]", "model.batch_norm=true", *ONE_STEP],
    **{
        f"attack {a}": [
            "algorithm.name=fedavg",
            "algorithm.local_steps=2",
            f"faults.attack.name={a}",
            "faults.attack.fraction=0.25",
        ]
        for a in ("sign_flip", "gaussian", "boost", "label_flip", "alie", "ipm")
    },
    **{
        f"robust {r}": [
            "algorithm.name=fedavg",
            "algorithm.local_steps=2",
            f"robust.cloud.name={r}",
            *(["robust.cloud.clip_norm=1.0"] if r == "clip" else []),
            *(["robust.cloud.m=3"] if r == "multi_krum" else []),
            "robust.cloud.bucket=2",
        ]
        for r in ("median", "trimmed_mean", "krum", "multi_krum", "clip", "geomed")
    },
    "robust krum": ["algorithm.name=fedavg", "robust.cloud.name=krum", "robust.cloud.f=0"],
    "robust multi_krum": [
        "algorithm.name=fedavg",
        "robust.cloud.name=multi_krum",
        "robust.cloud.f=0",
        "robust.cloud.m=3",
    ],
    "robust cclip edge": ["algorithm.name=hierfavg", "robust.edge.name=cclip"],
    "faults": ["faults.client_dropout=0.1", "faults.edge_failure=0.1", "faults.straggler=0.1"],
    "partial stragglers": [
        "algorithm.name=fedprox",
        "algorithm.local_steps=2",
        "faults.straggler=0.5",
        "faults.straggler_work=partial",
    ],
    "privacy": ["algorithm.name=fedavg", "algorithm.local_steps=2", "privacy.enabled=true"],
    "disk state": ["algorithm.name=fedavg", "algorithm.local_steps=2", "state_storage=disk"],
    # (its options: read by the MLflow logging, fedhp.mlflow_tracking)
    **(
        {"mlflow": ["algorithm.name=fedavg", "algorithm.local_steps=1", "mlflow.enabled=true"]}
        if importlib.util.find_spec("mlflow") is not None
        else {}
    ),
}


@contextmanager
def recorded_reads(cfg: RunConfig) -> Iterator[set[str]]:
    """The dotted keys of the options read inside the block, for ``cfg``'s sections and
    components (reads by the ``unread`` declarations themselves do not count)."""
    by_id: dict[int, str] = {}
    by_class: dict[type, str | None] = {}

    def walk(model: pydantic.BaseModel, prefix: str) -> None:
        by_id[id(model)] = prefix
        cls = type(model)
        by_class[cls] = None if cls in by_class else prefix  # (ambiguous: robust levels)
        for key in cls.model_fields:
            value = model.__dict__[key]
            if isinstance(value, pydantic.BaseModel):
                walk(value, f"{prefix}{key}.")

    walk(cfg, "")
    for section in COMPONENT_SECTIONS:
        by_class[component_registry(section).get(getattr(cfg, section)["name"])] = f"{section}."
    reads: set[str] = set()
    original = pydantic.BaseModel.__getattribute__

    def tracking(self: Any, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if name[:1] != "_" and name in type(self).model_fields:
            prefix = by_id.get(id(self)) or by_class.get(type(self))
            frame = sys._getframe(1)
            caller, back = frame.f_code, frame.f_back
            declaring = caller.co_name == "unread" or caller.co_filename.endswith("unread.py")
            validating = back is not None and "/pydantic/" in back.f_code.co_filename
            if prefix is not None and not declaring and not validating:
                reads.add(prefix + name)
        return value

    pydantic.BaseModel.__getattribute__ = tracking  # type: ignore[method-assign]
    try:
        yield reads
    finally:
        pydantic.BaseModel.__getattribute__ = original  # type: ignore[method-assign]


def all_options(cfg: RunConfig) -> set[str]:
    """Every option of the run: its sections' (nested) and its components' fields."""
    out: set[str] = set()

    def walk(model: type[pydantic.BaseModel], prefix: str) -> None:
        for key, field in model.model_fields.items():
            kind = field.annotation
            if key in COMPONENT_SECTIONS and prefix == "":
                continue
            if isinstance(kind, type) and issubclass(kind, pydantic.BaseModel):
                walk(kind, f"{prefix}{key}.")
            else:
                out.add(prefix + key)

    walk(RunConfig, "")
    for section in COMPONENT_SECTIONS:
        cls = component_registry(section).get(getattr(cfg, section)["name"])
        out |= {f"{section}.{key}" for key in cls.model_fields}
    return out


NOT_RUN_HERE = {"flower."}
"""Read only by the Flower backends (Ray, a subprocess per node): declared unread in-process,
and checked by name in :func:`test_flower_options_are_read_by_the_flower_backends`."""


def scenario(name: str, tmp: Path) -> list[str]:
    """The overrides of scenario ``name``: TINY, the scenario's own, and MNIST's subsample and
    labels partition where the scenario names no dataset or partition."""
    given = SCENARIOS[name]
    own = given(tmp) if callable(given) else given
    keys = {o.partition("=")[0].partition(".")[0] for o in own}
    return [*TINY, *([] if keys & {"dataset", "partition"} else MNIST), *own]


@pytest.fixture(autouse=True)
def _no_plot(monkeypatch: pytest.MonkeyPatch) -> None:
    """plot.png (matplotlib, most of a tiny run's time) reads rows, not options: not drawn."""
    monkeypatch.setattr("fedhp.engine.runner.plot_run", lambda *args, **kwargs: None)


def check(overrides: list[str], out: Path) -> tuple[set[str], set[str]]:
    """(options neither read nor declared unread, options declared unread but read) for one
    tiny run."""
    from fedhp.api import prepare, run_built

    cfg = resolve_config(None, overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with recorded_reads(cfg) as reads:
            resolve_config(None, overrides)  # (reads made while resolving: plugins)
            run_built(prepare(cfg), out)
    declared = set(unread_options(cfg))
    options = {o for o in all_options(cfg) if not o.startswith(tuple(NOT_RUN_HERE))}
    return options - reads - declared, declared & reads


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_option_is_read_or_refused(name: str, tmp_path: Path) -> None:
    ignored, refused_but_read = check(scenario(name, tmp_path), tmp_path / "run")
    assert not ignored, f"{name}: neither read nor declared unread: {sorted(ignored)}"
    assert not refused_but_read, f"{name}: declared unread but read: {sorted(refused_but_read)}"


def test_the_scenarios_name_every_registered_component(tmp_path: Path) -> None:
    named: dict[str, set[str]] = {s: set() for s in COMPONENT_SECTIONS}
    for name in SCENARIOS:
        for text in scenario(name, tmp_path):
            key, _, value = text.partition("=")
            section, _, option = key.partition(".")
            if option == "name" and section in named:
                named[section].add(value)
    named["dataset"].add("mnist")
    named["partition"].add("labels")
    for section, registry in (
        ("algorithm", ALGORITHMS),
        ("dataset", DATASETS),
        ("partition", PARTITIONERS),
        ("model", MODELS),
    ):
        built_in = {n for n in registry.names() if registry.get(n).__module__.startswith("fedhp.")}
        missing = built_in - named[section]  # (plugins registered by other tests are theirs)
        assert not missing, f"no scenario runs {section}s {sorted(missing)}"


def test_flower_options_are_read_by_the_flower_backends() -> None:
    """Every ``flower.*`` option is read (as ``.<option>``) by src/fedhp/flower/."""
    from fedhp.config import FlowerConfig

    folder = Path(__file__).parents[1] / "src" / "fedhp" / "flower"
    text = "".join(p.read_text() for p in folder.glob("*.py"))
    for key in FlowerConfig.model_fields:
        assert f".{key}" in text, f"flower.{key}: nothing in src/fedhp/flower reads it"


@pytest.fixture
def planted() -> Iterator[str]:
    """A throwaway algorithm with an option nothing reads."""

    class PlantedOptions(FedAvgOptions):
        planted: int = 3

    ALGORITHMS.register("planted_unread")(PlantedOptions)
    try:
        yield "planted_unread"
    finally:
        ALGORITHMS.forget_module(__name__)


def test_a_planted_unread_option_fails_the_check(planted: str, tmp_path: Path) -> None:
    overrides = [*TINY, *MNIST, f"algorithm.name={planted}", "algorithm.local_steps=2"]
    ignored, _ = check(overrides, tmp_path)
    assert ignored == {"algorithm.planted"}


def test_a_declared_but_read_option_fails_the_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Declaring ``lr`` unread for FedAvg, which reads it, is caught too."""
    monkeypatch.setattr(FedAvgOptions, "unread", lambda self, run: {"lr": "planted"})
    _, read = check([*TINY, *MNIST, "algorithm.name=fedavg", "algorithm.local_steps=2"], tmp_path)
    assert read == {"algorithm.lr"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.name=sfedhp", "algorithm.local_steps=3"], "algorithm.K and algorithm.R"),
        (["algorithm.name=hierfavg", "algorithm.local_steps=3"], "kappa1 and algorithm.kappa2"),
        (["algorithm.name=hierfavg", "federation.client_fraction=0.5"], "edges_per_round"),
        (["algorithm.name=fedavg", "federation.edges_per_round=2"], "client_fraction"),
        (["faults.attack.fraction=0.2"], "set faults.attack.name"),
        (
            ["algorithm.name=fedavg", "faults.attack.name=boost", "faults.attack.fraction=0.2"]
            + ["faults.attack.epsilon=0.2"],
            "faults.attack.name=ipm",
        ),
        (["robust.cloud.beta=0.2"], "trimmed_mean"),
        (["privacy.clip_norm=2"], "privacy.enabled=true"),
        (["flower.nodes=2"], "backend=flower-sim"),
        (["state_dir=/tmp/x"], "state_storage=disk"),
        (["public.source=test"], "public.per_class"),
        (["algorithm.name=perfedavg", "algorithm.lr=0.1"], "algorithm.alpha"),
    ],
)
def test_a_set_option_nothing_reads_is_a_one_line_error(overrides: list[str], message: str) -> None:
    key = next(o for o in reversed(overrides) if not o.startswith("algorithm.name"))
    with pytest.raises(ConfigError) as err:
        resolve_config(None, overrides)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"{key.partition('=')[0]} is not read by this run: ")
    assert message in text


def test_untouched_and_read_options_are_not_refused() -> None:
    resolve_config(None, ["algorithm.name=sfedhp"])  # local_steps at its default: fine
    resolve_config(None, ["algorithm.name=fedavg", "algorithm.local_steps=3"])
    resolve_config(None, ["algorithm.name=hierfavg", "federation.edges_per_round=2"])
    resolve_config(None, ["faults.attack.name=label_flip", "faults.attack.fraction=0.2"])


def old_config_yaml(cfg: RunConfig) -> dict[str, Any]:
    """config.yaml as written before issue 42: every option, read or not."""
    from fedhp.config import resolved_section

    data = cfg.model_dump(mode="json")
    for section in COMPONENT_SECTIONS:
        data[section] = resolved_section(section, data[section])
    return data


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["algorithm.name=hierfavg", "federation.edges_per_round=2"],
        ["algorithm.name=fedavg", "faults.attack.name=gaussian", "faults.attack.fraction=0.2"],
        ["algorithm.name=perfedavg", "privacy.enabled=true"],
    ],
)
def test_a_config_yaml_written_before_still_matches(overrides: list[str]) -> None:
    """Sweeps, reproductions and --resume recognise a run from its config.yaml: one written
    before unread options were dropped (and refused) normalizes to today's, also where it set
    an unread option (a reproduction used to give HierFAVG a client_fraction)."""
    from fedhp.config import config_to_dict, normalized_config

    cfg = resolve_config(None, overrides)
    today = config_to_dict(cfg)
    old = old_config_yaml(cfg)
    assert old != today  # (it held unread options)
    assert normalized_config(old) == today
    sampling = "client_fraction" if "federation.client_fraction" in unread_options(cfg) else ""
    old["federation"][sampling or "edges_per_round"] = 1  # (the kind the method does not read)
    old["faults"]["attack"]["sign_scale"] = 4.0
    assert normalized_config(old) == today


def test_config_yaml_holds_no_unread_option(tmp_path: Path) -> None:
    """What ``fedhp run`` writes: none of the run's unread options, and it runs again as given."""
    import yaml

    from fedhp.cli import main
    from fedhp.unread import leaf_keys

    args = [*TINY, *MNIST, "algorithm.name=sfedhp", "algorithm.K=1", "algorithm.R=1"]
    assert main(["run", *args, "--out", str(tmp_path / "a")]) == 0
    written = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    unread = unread_options(resolve_config(None, args))
    assert {"algorithm.local_steps", "federation.client_fraction", "flower.nodes"} <= set(unread)
    assert not set(leaf_keys(written)) & set(unread)
    assert main(["run", str(tmp_path / "a" / "config.yaml"), "--out", str(tmp_path / "b")]) == 0


def test_resume_reads_a_config_yaml_written_before(tmp_path: Path) -> None:
    """``--resume`` of a run folder whose config.yaml still holds unread options (written
    before they were refused) resumes instead of refusing them."""
    import yaml

    from fedhp.cli import main

    args = [*TINY, *MNIST, "algorithm.name=sfedhp", "algorithm.K=1", "algorithm.R=1"]
    args.append("checkpoint_every=1")
    out = tmp_path / "run"
    assert main(["run", *args, "--out", str(out)]) == 0
    old = old_config_yaml(resolve_config(None, args))
    (out / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    assert main(["run", "--resume", str(out), "rounds=2"]) == 0
    assert len((out / "metrics.csv").read_text().splitlines()) == 3  # header, rounds 1 and 2


def test_a_flower_deployment_reads_the_flower_options() -> None:
    """``fedhp flower deploy`` runs through Flower whatever ``backend`` says: its ``flower.*``
    are read (not refused) and travel to the nodes in the configuration."""
    from fedhp.config import config_to_dict

    given = ["flower.sparse_wire=false"]
    with pytest.raises(ConfigError, match="^flower.sparse_wire is not read"):
        resolve_config(None, given)
    cfg = resolve_config(None, given, on_flower=True)
    assert config_to_dict(cfg, on_flower=True)["flower"]["sparse_wire"] is False
    assert "flower" not in config_to_dict(cfg)
