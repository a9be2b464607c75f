"""Run configuration: the commented defaults file, user YAML and ``key=value`` overrides,
validated strictly (unknown keys, wrong types and out-of-range values are one-line errors)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml

from fedhp.errors import ConfigError, FedhpError, FedhpWarning
from fedhp.privacy.options import PrivacyOptions
from fedhp.registry import check_int_range, check_no_bools, format_validation_error
from fedhp.robust import RobustOptions

MAX_ROUNDS = 10**7
"""The most global rounds a run may ask for (a larger count is a typo, not an experiment)."""


class FederationConfig(pydantic.BaseModel):
    """Clients, edges, sampling and weighting."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    num_clients: int = pydantic.Field(20, gt=0)
    num_edges: int = pydantic.Field(4, gt=0)
    edge_sizes: list[pydantic.PositiveInt] | None = None
    client_fraction: float = pydantic.Field(1.0, gt=0, le=1)
    edges_per_round: int | None = pydantic.Field(None, gt=0)
    weighting: Literal["uniform", "samples"] = "uniform"
    sampling: Literal["without_replacement", "with_replacement"] = "without_replacement"

    @pydantic.field_validator("edges_per_round")
    @classmethod
    def _edges_fit(cls, value: int | None, info: pydantic.ValidationInfo) -> int | None:
        num_edges = info.data.get("num_edges")
        if value is not None and isinstance(num_edges, int) and value > num_edges:
            raise ValueError(f"must be at most num_edges={num_edges}")
        return value


class CommConfig(pydantic.BaseModel):
    """Communication accounting options."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    zero_threshold: float = pydantic.Field(0.0, ge=0)


class PublicConfig(pydantic.BaseModel):
    """A public dataset D_pub for the server-side methods that need one (FNR-FL): class-balanced,
    ``per_class`` samples of every class, carved out of the training pool before partitioning
    (``holdout``: disjoint from every client's data and every evaluation set) or taken from the
    test pool (``test``: the FNR-FL authors' protocol, a train-on-test leak that methods refuse
    unless told otherwise)."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    per_class: int = pydantic.Field(0, ge=0, description="samples per class (0: no D_pub)")
    source: Literal["holdout", "test"] = "holdout"


class SubsampleConfig(pydantic.BaseModel):
    """A seeded, class-stratified subset of the dataset, taken before D_pub and partitioning:
    quick runs of big models on a CPU (every class keeps its share, largest remainder)."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    train: int | None = pydantic.Field(None, gt=0, description="training samples kept (all)")
    test: int | None = pydantic.Field(None, gt=0, description="test samples kept (all)")


AttackName = Literal["none", "sign_flip", "gaussian", "boost", "label_flip", "alie", "ipm"]


class AttackConfig(pydantic.BaseModel):
    """Malicious clients (:mod:`fedhp.engine.attacks`): a fixed, seeded set of
    ``fraction`` of the clients, chosen once, that tamper with what they upload (or, for
    ``label_flip``, with their own training labels)."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    name: AttackName = "none"
    fraction: float = pydantic.Field(0.0, ge=0, lt=1, description="share of malicious clients")
    placement: Literal["spread", "concentrated"] = pydantic.Field(
        "spread",
        description="spread: drawn at random over all clients; concentrated: the clients of "
        "the first edges, in edge order",
    )
    sign_scale: float = pydantic.Field(1.0, gt=0, description="sign_flip: upload -s * update")
    noise_std: float = pydantic.Field(1.0, gt=0, description="gaussian: the update is N(0, s^2)")
    boost: float = pydantic.Field(10.0, gt=0, description="boost: upload k * update")
    z: float | None = pydantic.Field(
        None, gt=0, description="alie: mean - z std of the benign updates (null: Baruch's z_max)"
    )
    epsilon: float = pydantic.Field(
        0.1,
        gt=0,
        description="ipm: upload -epsilon times the mean of the benign updates (Xie et al. 2019; "
        "0.1 as in Karimireddy et al.'s code)",
    )

    @property
    def enabled(self) -> bool:
        return self.name != "none" and self.fraction > 0

    def unread(self) -> dict[str, str]:
        """The options no attack reads in this configuration (issue 42): all but ``name``
        without an attack, all but ``name`` and ``fraction`` at fraction 0, and the options
        of the other attacks (:data:`ATTACK_OPTIONS`)."""
        if self.name == "none":
            why = "no attack is named; set faults.attack.name to use it, or drop it"
            return {k: why for k in type(self).model_fields if k != "name"}
        if self.fraction == 0:
            why = "faults.attack.fraction=0 makes no client malicious; set it above 0"
            return {k: why for k in type(self).model_fields if k not in ("name", "fraction")}
        return {
            option: f"faults.attack.name is {self.name}, and only the {attack} attack reads it; "
            f"set faults.attack.name={attack} to use it, or drop it"
            for option, attack in ATTACK_OPTIONS.items()
            if attack != self.name
        }


ATTACK_OPTIONS = {
    "sign_scale": "sign_flip",
    "noise_std": "gaussian",
    "boost": "boost",
    "z": "alie",
    "epsilon": "ipm",
}
"""The attack options that one attack alone reads, and that attack."""


class FaultsConfig(pydantic.BaseModel):
    """Simulated failures, drawn independently each round from their own seeded stream (see
    :mod:`fedhp.engine.faults`), and malicious clients (``attack``)."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    client_dropout: float = pydantic.Field(0.0, ge=0, le=1)
    edge_failure: float = pydantic.Field(0.0, ge=0, le=1)
    straggler: float = pydantic.Field(0.0, ge=0, le=1)
    straggler_work: Literal["drop", "partial"] = pydantic.Field(
        "drop",
        description="drop: a straggler's update misses the deadline and is dropped (every "
        "method); partial: FedProx's systems heterogeneity, a straggler does 1 .. E-1 of its E "
        "local epochs (or steps), drawn uniformly, and a method that keeps partial work "
        "(FedProx) aggregates it while the others (FedAvg) drop it",
    )
    seed_offset: int = pydantic.Field(0, ge=0, lt=2**31)
    attack: AttackConfig = AttackConfig()

    @property
    def enabled(self) -> bool:
        return self.client_dropout > 0 or self.edge_failure > 0 or self.straggler > 0


class RobustConfig(pydantic.BaseModel):
    """The aggregation rule of each level (:mod:`fedhp.robust`): ``edge`` where an edge server
    averages its clients, ``cloud`` where the cloud averages clients (flat methods) or edges."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    cloud: RobustOptions = RobustOptions()
    edge: RobustOptions = RobustOptions()


class FlowerConfig(pydantic.BaseModel):
    """Options of the Flower backends (see docs/flower.md); not read by ``backend: inprocess``
    (refused when set there, :mod:`fedhp.unread`)."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    nodes: int | None = pydantic.Field(None, gt=0)
    timeout: float = pydantic.Field(600.0, gt=0)
    num_cpus: float = pydantic.Field(1.0, gt=0)
    ray_cpus: int | None = pydantic.Field(None, gt=0)
    node_cache: bool = True
    sparse_wire: bool = True


class EngineConfig(pydantic.BaseModel):
    """How the engine batches its work on the device (:mod:`fedhp.models.policy`)."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    clients_per_chunk: int | None = pydantic.Field(
        None, gt=0, description="clients trained together (null: sized for the device)"
    )
    memory_fraction: float = pydantic.Field(
        0.5, gt=0, le=1, description="CUDA: share of the free memory one client chunk may use"
    )
    channels_last: bool = pydantic.Field(
        False, description="conv nets: inputs in channels-last memory order (measure first)"
    )
    cuda_graphs: bool = pydantic.Field(
        False, description="CUDA: local steps captured once as CUDA graphs and replayed"
    )


class MlflowConfig(pydantic.BaseModel):
    """``mlflow:``: log the run (params, metrics per round, files) to MLflow
    (:mod:`fedhp.mlflow_tracking`, docs/outputs.md); needs the ``fedhp[mlflow]`` extra."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = pydantic.Field(False, description="log this run to MLflow")
    tracking_uri: str | None = pydantic.Field(
        None, description="where (null: sqlite:///<the run folder's parent>/mlflow.db)"
    )
    experiment: str = pydantic.Field("fedhp", min_length=1, description="the MLflow experiment")
    artifacts: Literal["results", "all", "none"] = pydantic.Field(
        "results", description="results: the run's files but its *.pt and state/; all; none"
    )

    @pydantic.field_validator("tracking_uri")
    @classmethod
    def _a_uri(cls, value: str | None) -> str | None:
        if value is not None and "://" not in value and value != "databricks":
            raise ValueError(
                f"{value!r} is not a URI; give e.g. sqlite:///runs/mlflow.db or "
                "http://localhost:5000 (null: sqlite:///<the run folder's parent>/mlflow.db)"
            )
        return value


def cuda_graphs_unread(cfg: RunConfig, graph_steps: bool | None) -> str | None:
    """Why the run does not read ``engine.cuda_graphs`` (None: it does): not on CUDA, under
    bf16 (autocast caches its casts across calls, which a capture would freeze), or a method
    whose steps have no captured form (``graph_steps`` false: its options'
    ``graph_steps()``; None: not known)."""
    if not str(cfg.device).startswith("cuda"):
        return "CUDA graphs need a CUDA device; set device=cuda, or drop it"
    if cfg.precision == "bf16":
        return "bf16 steps run without graphs (autocast caches casts); use precision=fp32 or tf32"
    if graph_steps is False:
        name = cfg.algorithm.get("name")
        return (
            f"{name} with these options has no captured steps (docs/gpu.md, CUDA graphs); drop it"
        )
    return None


class RunConfig(pydantic.BaseModel):
    """A whole run. Component sections (dataset, partition, model, algorithm) are validated by the
    component registered under their ``name`` (see :func:`fedhp.build.check_components`)."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    seed: int = pydantic.Field(0, ge=0, lt=2**31)
    rounds: int = pydantic.Field(200, gt=0, le=MAX_ROUNDS)
    eval_every: int = pydantic.Field(1, gt=0)
    eval_split: Literal["test", "val"] = "test"
    eval_train: bool = pydantic.Field(
        True, description="also evaluate on the training data (train_loss, personal_train_loss)"
    )
    checkpoint_every: int = pydantic.Field(10, ge=0)
    state_storage: Literal["memory", "disk"] = pydantic.Field(
        "memory", description="disk: per-client state rows in memory-mapped files (CPU)"
    )
    state_dir: str | None = pydantic.Field(
        None, description="folder of the disk-backed state (default: <out>/state)"
    )
    max_loss: float | None = pydantic.Field(1000.0, gt=0)
    device: str = "cpu"
    threads: int | None = pydantic.Field(None, gt=0, le=4096)
    precision: Literal["fp32", "tf32", "bf16"] = "fp32"
    engine: EngineConfig = EngineConfig()
    progress: bool = True
    dataset: dict[str, Any]
    partition: dict[str, Any]
    federation: FederationConfig = FederationConfig()
    model: dict[str, Any]
    algorithm: dict[str, Any]
    comm: CommConfig = CommConfig()
    public: PublicConfig = PublicConfig()
    subsample: SubsampleConfig = SubsampleConfig()
    faults: FaultsConfig = FaultsConfig()
    robust: RobustConfig = RobustConfig()
    privacy: PrivacyOptions = PrivacyOptions()
    backend: Literal["inprocess", "flower-sim"] = "inprocess"
    flower: FlowerConfig = FlowerConfig()
    plugins: list[str] = []
    tensorboard: bool = False
    mlflow: MlflowConfig = MlflowConfig()

    @pydantic.field_validator("plugins")
    @classmethod
    def _absolute_plugin_paths(cls, value: list[str]) -> list[str]:
        from fedhp.plugins import resolve_plugin

        return [resolve_plugin(spec) for spec in value]


def default_config_dict() -> dict[str, Any]:
    """The packaged, commented defaults as a mapping."""
    text = resources.files("fedhp").joinpath("defaults.yaml").read_text()
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def deep_merge(
    base: Mapping[str, Any], update: Mapping[str, Any], replace_renamed: bool = True
) -> dict[str, Any]:
    """Recursively merge ``update`` into a copy of ``base``.

    With ``replace_renamed``, a component section whose ``name`` changes is replaced, not merged,
    so the options of the default algorithm (say) are not carried over to another one.
    """
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        old = out.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            renamed = "name" in value and value.get("name") != old.get("name")
            if replace_renamed and renamed:
                out[key] = copy.deepcopy(dict(value))
            else:
                out[key] = deep_merge(old, value, replace_renamed)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(text: str) -> dict[str, Any]:
    """``a.b.c=value`` → ``{"a": {"b": {"c": value}}}`` with ``value`` parsed as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: write it as key=value, e.g. algorithm.lr=0.1")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    result: dict[str, Any] = {}
    node = result
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return result


def _leaf_keys(prefix: str, value: Any) -> list[str]:
    """The dotted keys an override sets (a mapping value sets each of its keys)."""
    if isinstance(value, Mapping) and value:
        return [k for key, sub in value.items() for k in _leaf_keys(f"{prefix}.{key}", sub)]
    return [prefix]


def repeated_overrides(overrides: Sequence[str]) -> list[str]:
    """One note per key that two ``key=value`` overrides both set (or that one sets as a whole
    section and another inside it), for a warning: the later one is used, as
    :func:`resolve_config` merges them in order."""
    seen: dict[str, str] = {}
    notes: list[str] = []
    for text in overrides:
        parsed = parse_override(text)
        key = next(iter(parsed))
        for leaf in _leaf_keys(key, parsed[key]):
            for other, first in seen.items():
                if leaf == other or leaf.startswith(other + ".") or other.startswith(leaf + "."):
                    notes.append(
                        f"{leaf} given twice ({first}, then {text}); the later one is used"
                    )
                    break
            seen[leaf] = text
    return notes


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in keys:
                raise ConfigError(
                    f"key {key!r} appears twice (lines {keys[key]} and {line}); keep one"
                )
            if isinstance(key, str | int | float | bool):
                keys[key] = line
        return super().construct_mapping(node, deep)


def load_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping from ``path``, or a one-line :class:`ConfigError`."""
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path}: is a folder; name a YAML file") from None
    except ConfigError as err:
        raise ConfigError(f"config file {path}: {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {path}: cannot be read ({err})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config file {path}: invalid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path}: must be a mapping of options, got {type(data).__name__}"
        )
    return data


def resolve_config(
    config_path: Path | None = None,
    overrides: Sequence[str] = (),
    base: Mapping[str, Any] | None = None,
    plugins: Sequence[str] = (),
    refuse_unread: bool = True,
    on_flower: bool = False,
) -> RunConfig:
    """Defaults ← YAML file ← overrides, validated; raises :class:`ConfigError` on bad input.

    A key the YAML or the overrides set that the run does not read (:mod:`fedhp.unread`: say
    ``algorithm.local_steps`` for sFedHP, whose local work is ``R`` and ``K``) is a one-line
    error naming it and what to set instead; ``refuse_unread=False`` skips that check (a
    ``config.yaml`` written before it, as ``--resume`` reads one); ``on_flower``: the run goes
    through Flower whatever ``backend`` says (``fedhp flower deploy``), so ``flower.*`` is read.

    The user's YAML and overrides are merged first (order among them does not matter for
    different keys), then laid over the defaults: naming another component there (e.g.
    ``algorithm.name=fedavg``) drops the default component's options instead of mixing them.
    ``plugins`` (``--plugin``) are appended to the YAML's ``plugins``; relative file paths in the
    YAML are taken from the YAML file's folder, others from the working directory.
    """
    from fedhp.plugins import resolve_plugin

    user: dict[str, Any] = load_yaml(config_path) if config_path is not None else {}
    listed = user.get("plugins")
    if config_path is not None and isinstance(listed, list):
        folder = config_path.resolve().parent
        user["plugins"] = [resolve_plugin(p, folder) if isinstance(p, str) else p for p in listed]
    for text in overrides:
        user = deep_merge(user, parse_override(text), replace_renamed=False)
    if plugins:
        listed = user.get("plugins") or []
        user["plugins"] = [*listed, *plugins] if isinstance(listed, list) else listed
    data = dict(base) if base is not None else default_config_dict()
    user = with_current_names(user, data)  # before the defaults' new names join them
    cfg = validate_config(with_natural_clients(deep_merge(data, user), user))
    if refuse_unread:
        from fedhp.unread import refuse_unread as refuse

        refuse(cfg, user, on_flower)
    return cfg


_NOTED_OLD_NAMES: set[str] = set()
"""The old option names (``section.key``) already reported in this process: each is reported
once."""


def with_current_names(
    data: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``data`` with each component option given under its old name (the component's
    ``old_names``, e.g. sFedHP's ``global_lr``, now ``edge_lr``) under its current name, said
    in one warning line per old name and process; both names given is a one-line error.
    ``base``: where a section's component ``name`` comes from when ``data`` gives none."""
    from fedhp.unread import component_registry

    out = dict(data)
    for section in COMPONENT_SECTIONS:
        given = out.get(section)
        if not isinstance(given, Mapping):
            continue
        fallback = base.get(section) if base is not None else None
        name = given.get("name", fallback.get("name") if isinstance(fallback, Mapping) else None)
        registry = component_registry(section)
        if not isinstance(name, str) or name not in registry:
            continue  # validation names the problem
        for old, new in getattr(registry.get(name), "old_names", {}).items():
            if old not in given:
                continue
            if new in given:
                raise ConfigError(
                    f"{section}.{old} and {section}.{new} both given: {old} is the old name of "
                    f"{new}; keep {section}.{new} only"
                )
            given = {(new if key == old else key): value for key, value in given.items()}
            if f"{section}.{old}" not in _NOTED_OLD_NAMES:
                _NOTED_OLD_NAMES.add(f"{section}.{old}")
                warnings.warn(
                    f"{section}.{old} is the old name of {section}.{new} ({name}); read as "
                    f"{section}.{new}, the name to write from now on",
                    FedhpWarning,
                    stacklevel=2,
                )
        out[section] = given
    return out


def with_natural_clients(data: dict[str, Any], user: Mapping[str, Any]) -> dict[str, Any]:
    """A dataset with its own clients (``natural_clients``, e.g. ``shakespeare``) and no partition
    or client count set by the user: ``partition.name=natural`` and the dataset's client count
    (loading the dataset, which checks its options too)."""
    dataset = data.get("dataset")
    name = dataset.get("name") if isinstance(dataset, Mapping) else None
    from fedhp.data import DATASETS

    if not isinstance(name, str) or name not in DATASETS.names():
        return data  # validation names the problem
    if not getattr(DATASETS.get(name), "natural_clients", False):
        return data
    out = copy.deepcopy(data)
    if "partition" not in user:
        out["partition"] = {"name": "natural"}
    federation = user.get("federation")
    counted = isinstance(federation, Mapping) and "num_clients" in federation
    if not counted and out["partition"].get("name") == "natural":
        source = DATASETS.build(out["dataset"], "dataset")
        out.setdefault("federation", {})["num_clients"] = source.num_natural_clients()
    return out


def validate_config(data: Mapping[str, Any]) -> RunConfig:
    """A :class:`RunConfig` from a mapping, or a one-line :class:`ConfigError`; imports the
    installed and listed plugins (:func:`fedhp.plugins.load_plugins`) so the components they
    register can be named."""
    from fedhp.plugins import load_plugins

    data = with_current_names(data)
    check_no_bools(RunConfig, data, "")  # rounds=true is an error, not 1 round
    try:
        cfg = RunConfig.model_validate(dict(data))
    except pydantic.ValidationError as err:
        raise ConfigError(format_validation_error(err, "")) from None
    check_int_range(cfg.model_dump(), "")
    load_plugins(cfg.plugins)
    return cfg


COMPONENT_SECTIONS = ("dataset", "partition", "model", "algorithm")
"""The sections validated by the component registered under their ``name``."""


def resolved_section(section: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """A component section with every option of the component and its value: ``name`` first,
    then the options in the component's field order (what ``config.yaml`` holds).

    An option left at its default is written only where writing it keeps the options the same:
    a default that holds only while the option is unset (``local_steps`` beside
    ``local_epochs``) stays out. Validating the result gives the same options."""
    from fedhp.unread import component_registry

    registry = component_registry(section)
    options = registry.build(data, section)
    cls = type(options)
    full = options.model_dump(mode="json")
    out = {k: full[k] for k in options.model_fields_set if k in full}
    for key in full:
        if key in out:
            continue
        try:
            cls.model_validate({**out, key: full[key]})
        except pydantic.ValidationError:
            continue  # a default that only holds while unset
        out[key] = full[key]
    try:
        again = cls.model_validate(out).model_dump(mode="json")
    except pydantic.ValidationError:
        again = None
    if again != full:  # cannot be written out in full: keep the options as given
        return dict(data)
    return {"name": data["name"], **{k: out[k] for k in full if k in out}}


def config_to_dict(cfg: RunConfig, on_flower: bool = False) -> dict[str, Any]:
    """The resolved configuration as plain data (what ``config.yaml`` holds): every top-level
    option, and every option of the dataset, partition, model and algorithm with its value
    (:func:`resolved_section`), but none the run does not read (:mod:`fedhp.unread`; a
    section left with no option read goes; ``on_flower``: the run goes through Flower whatever
    ``backend`` says, its ``flower`` options kept). Running it again gives the same run."""
    from fedhp.unread import drop_unread, unread_options

    data = cfg.model_dump(mode="json")
    for section in COMPONENT_SECTIONS:
        data[section] = resolved_section(section, data[section])
    return drop_unread(data, unread_options(cfg, on_flower))


def with_added_defaults(saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` (a resolved configuration written earlier) with the keys added since
    (``backend``, ``flower``, ``plugins``, ``tensorboard``, ``public``, ``subsample``,
    ``eval_train``, ``robust``, ``privacy``, ``faults.attack``, ``state_storage``,
    ``state_dir``) at their defaults, so it
    compares equal to the same run's configuration resolved today."""
    added = {
        "backend": "inprocess",
        "flower": FlowerConfig().model_dump(mode="json"),
        "plugins": [],
        "tensorboard": False,
        "public": PublicConfig().model_dump(mode="json"),
        "subsample": SubsampleConfig().model_dump(mode="json"),
        "eval_train": True,
        "robust": RobustConfig().model_dump(mode="json"),
        "privacy": PrivacyOptions().model_dump(mode="json"),
        "state_storage": "memory",
        "state_dir": None,
    }
    out = {**{k: v for k, v in added.items() if k not in saved}, **saved}
    faults = out.get("faults")
    if isinstance(faults, dict) and "attack" not in faults:
        out["faults"] = {**faults, "attack": AttackConfig().model_dump(mode="json")}
    return out


def normalized_config(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A configuration written earlier (config.yaml, a checkpoint's), in today's resolved form
    (:func:`config_to_dict`, keys added since at their defaults), to compare with another run's;
    as written (with the added keys) where it no longer validates. A config.yaml written before
    issue 42 holds options the run did not read; :func:`config_to_dict` drops them here as it
    does from a configuration resolved today, so the same run compares equal."""
    data = with_added_defaults(dict(saved))
    try:
        return config_to_dict(validate_config(data))
    except FedhpError:  # no longer valid, or a plugin gone
        return data
