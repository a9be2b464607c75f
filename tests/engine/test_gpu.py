"""The GPU path: every algorithm and every model runs with ``device=cuda`` and, after one round,
agrees with the same run on the CPU to 1e-4 (global models, personalized models, the whole
algorithm state, the round's statistics and the evaluated losses).

The same seed does not give the same random draws on both devices (``fedhp/build.py``): a CUDA
run draws its minibatches from a CUDA generator of its own (another stream), while a CPU run
draws them from the engine generator ``ctx.generator`` itself, which therefore also sits at
other positions for everything else drawn from it (client sampling, capabilities, P-UCBV, FNR-FL's
D_pub order). The comparisons align the two runs in one of two ways:

* full batches (most tests): every minibatch is a client's whole training set (``batch_size`` =
  its sample count), so any draw on any device selects the same samples (only their order
  differs); the CPU run's minibatches come from a generator of their own, as on CUDA
  (:func:`own_sampler_stream`), so the engine generator serves both runs the same draws. The
  CUDA run is the engine exactly as configured;
* partial minibatches: the CUDA run draws its indices on the host from the engine generator, as
  the CPU run does (:class:`HostSampler`).

The other random streams (pFedGP's Gibbs draws, the failures, the dense methods' capabilities)
are host generators on both devices. TF32 is switched off for the comparisons: cuDNN
convolutions use it by default on Ampere and later GPUs, which alone moves conv nets by ~1e-3.

ResNet-18's global model is compared through a float64 reference instead of entry-wise: both
devices' float32 rounds must be about as far from the float64 round, relative to the update
(CUDA's error at most twice the larger of the CPU's two float32 implementations': oneDNN's round
is 1.15e-2 off, PyTorch's native convolutions' 2.68e-2, an H100's 2.68e-2;
``tests/engine/float64_reference.py``; the CPU side runs in every test session,
``tests/engine/test_float64_reference.py``). Entry-wise, the H200 run differed from the CPU's by
up to 3.4e-4 in 8,925 of 11.2 M entries.

The data are fabricated (4 clients under 2 edges, 1x16x16 images of 4 classes, 12 training
samples each; flat sparse features for the softmax cases), so nothing needs downloading on the
GPU machine.
"""

from __future__ import annotations

import csv
import math
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhp import build
from fedhp.algorithms import ALGORITHMS
from fedhp.build import build_experiment
from fedhp.config import RunConfig, resolve_config
from fedhp.data.public import PublicData
from fedhp.data.types import ClientData, DatasetArrays
from fedhp.engine.checkpoint import CHECKPOINT_FILE, load_checkpoint
from fedhp.engine.experiment import ENGINE_SEED_OFFSET, MODEL_SEED_OFFSET, Experiment
from fedhp.engine.ops import sgd_steps
from fedhp.engine.runner import run_experiment
from fedhp.engine.sampler import BatchSampler, EpochBatches
from fedhp.errors import FedhpWarning
from fedhp.models import MODELS
from fedhp.models.policy import ROW_COPIES, ExecutionPolicy, build_policy
from tests.engine.float64_reference import (
    assert_as_accurate,
    cpu_float32_rounds,
    fedavg_round_reference,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device: the GPU path is checked only where a GPU is present",
)

ATOL = RTOL = 1e-4
CLIENTS, EDGES, CLASSES = 4, 2, 4
SHAPE = (1, 16, 16)
TRAIN, TEST, VAL, PUBLIC = 3, 2, 1, 4  # samples per class: per client (train/test/val), D_pub
N_TRAIN = TRAIN * CLASSES  # 12 per client: batch_size=N_TRAIN makes every minibatch full

BASE = [
    "progress=false",
    "seed=3",
    "rounds=1",
    "eval_every=1",
    "checkpoint_every=1",
    "dataset.name=synthetic",  # validated only: the data come from fabricated() below
    f"federation.num_clients={CLIENTS}",
    f"federation.num_edges={EDGES}",
]
DNN = ["model.name=dnn", "model.hidden=[16]"]  # unless a case names its model
SPARSE_MODELS = ("softmax",)  # trained on sparse COO features (fabricated())
FULL_BATCH = [f"algorithm.batch_size={N_TRAIN}"]

# One round's local work kept small; an algorithm missing here runs with "local_steps=2".
# The Fed-HT family starts from x0 = 0, where a ReLU network has no gradient but its output
# bias's (zero here: the classes are balanced): MLR.
ALGORITHM_OPTIONS: dict[str, list[str]] = {
    "diht": ["model.name=mlr", "algorithm.lr=0.05"],  # local_steps is always 1
    "fedht": ["model.name=mlr", "algorithm.lr=0.05", "algorithm.local_steps=2"],
    "fediterht": ["model.name=mlr", "algorithm.lr=0.05", "algorithm.local_steps=2"],
    "fnrfl": ["algorithm.local_steps=2", "algorithm.refine_epochs=2", f"public.per_class={PUBLIC}"],
    "hierfavg": ["algorithm.kappa1=2", "algorithm.kappa2=2"],
    "pfedgp": [
        "algorithm.gibbs_steps=2",
        "algorithm.chains=4",
        "algorithm.test_chains=4",
        "algorithm.inner_steps=2",
    ],
    "pfedme": ["algorithm.R=2", "algorithm.K=2"],
    "sfedhp": ["algorithm.R=2", "algorithm.K=2"],
}
# Engine paths the defaults above leave out: local epochs, client sampling, sample weighting,
# momentum and weight decay, sparse (COO) features, pFedGP's inducing points and learned kernel.
VARIANTS: dict[str, list[str]] = {
    "fedavg-epochs": ["algorithm.local_epochs=2"],
    "fedavg-sampled": ["algorithm.local_steps=2", "federation.client_fraction=0.5"],
    "fedavg-weighted": ["algorithm.local_steps=2", "federation.weighting=samples"],
    "fedavg-momentum": [
        "algorithm.local_steps=2",
        "algorithm.momentum=0.9",
        "algorithm.weight_decay=0.01",
    ],
    "fedprox-epochs": ["algorithm.name=fedprox", "algorithm.local_epochs=1"],
    "fedavg-sparse-features": ["model.name=softmax", "algorithm.local_steps=2"],
    "fedht-sparse-features": [
        "algorithm.name=fedht",
        "model.name=softmax",
        "algorithm.lr=0.05",
        "algorithm.local_steps=2",
    ],
    "pfedgp-ip": [
        "algorithm.name=pfedgp",
        "algorithm.gibbs_steps=2",
        "algorithm.chains=4",
        "algorithm.test_chains=4",
        "algorithm.inducing=true",
        "algorithm.inducing_points=3",
        "algorithm.learn_kernel=true",
    ],
}
TINY_VGG = ["model.name=vgg", "model.cfg=[4,M,8,M]"]
MODEL_CASES = [
    pytest.param(["model.name=mlr"], id="mlr"),
    pytest.param(["model.name=dnn", "model.hidden=[32,16]"], id="dnn"),
    pytest.param(["model.name=cnn"], id="cnn"),
    pytest.param(["model.name=cnn2"], id="cnn2"),
    pytest.param(TINY_VGG, id="vgg"),
    pytest.param([*TINY_VGG, "model.batch_norm=true"], id="vgg-bn"),
    pytest.param(
        [*TINY_VGG, "model.batch_norm=true", "algorithm.buffers=local"], id="vgg-bn-local"
    ),
    pytest.param(["model.name=resnet18"], id="resnet18", marks=pytest.mark.slow),
]
MINIBATCH_CASES = {
    "fedavg": ["algorithm.name=fedavg", "algorithm.local_steps=3"],
    "fedavg-epochs": ["algorithm.name=fedavg", "algorithm.local_epochs=2"],  # partial last batch
    "fedavg-replacement": [
        "algorithm.name=fedavg",
        "algorithm.local_steps=3",
        "federation.sampling=with_replacement",
    ],
    "heterofl": ["algorithm.name=heterofl", "algorithm.local_steps=3"],  # masked steps
    "pfedme": ["algorithm.name=pfedme", "algorithm.R=2", "algorithm.K=2"],
    "sfedhp": ["algorithm.name=sfedhp", "algorithm.R=2", "algorithm.K=2"],
}


@pytest.fixture(autouse=True)
def _full_float32() -> Iterator[None]:
    """Compare in full float32: no TF32 in cuDNN convolutions (on by default) or matmuls."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def fabricated(cfg: RunConfig) -> tuple[DatasetArrays, list[ClientData], PublicData | None]:
    """Stands in for :func:`fedhp.build.partition_data`: every client holds ``TRAIN`` /
    ``TEST`` / ``VAL`` samples of every class (noisy class patterns, learnable), D_pub
    ``PUBLIC`` per class where ``public.per_class`` asks for one. For the linear sparse-learning
    models (:data:`SPARSE_MODELS`) the features are flat, 70% zeros and kept sparse (COO, as
    LibSVM data read with ``sparse=true``)."""
    g = torch.Generator().manual_seed(20240611)
    patterns = torch.randn(CLASSES, *SHAPE, generator=g)
    sparse = cfg.model.get("name") in SPARSE_MODELS

    def samples(per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(CLASSES).repeat(per_class)
        y = y[torch.randperm(len(y), generator=g)]
        x = patterns[y] + torch.randn(len(y), *SHAPE, generator=g)
        if sparse:
            x = x.flatten(1) * (torch.rand(len(y), x[0].numel(), generator=g) < 0.3)
            x = x.to_sparse().coalesce()
        return x, y

    clients = [ClientData(*samples(TRAIN), *samples(TEST), *samples(VAL)) for _ in range(CLIENTS)]
    data = DatasetArrays(
        name="fabricated",
        train_x=torch.cat([c.train_x for c in clients]),
        train_y=torch.cat([c.train_y for c in clients]),
        test_x=torch.cat([c.test_x for c in clients]),
        test_y=torch.cat([c.test_y for c in clients]),
        num_classes=CLASSES,
    )
    public = PublicData(*samples(PUBLIC), "holdout") if cfg.public.per_class else None
    return data, clients, public


class HostSampler(BatchSampler):
    """Draws minibatch indices on the host from ``generator`` (the engine's CPU generator, as a
    CPU run does) and moves them to ``device``: the same minibatches as the CPU run's."""

    def __init__(self, sampler: BatchSampler, generator: torch.Generator, device: torch.device):
        super().__init__(
            sampler.counts.cpu(),
            generator,
            sampler.replacement,
            rows=None if sampler.rows is None else sampler.rows.cpu(),
            total=sampler.total,
            max_count=sampler.max_count,
            min_count=sampler.min_count,
        )
        self.device = device

    def draw(self, clients: torch.Tensor, batch_size: int) -> torch.Tensor:
        return super().draw(clients.cpu(), batch_size).to(self.device)

    def epochs(self, clients: torch.Tensor, batch_size: int, epochs: int) -> EpochBatches:
        plan = super().epochs(clients.cpu(), batch_size, epochs)
        return EpochBatches(
            plan.index.to(self.device), plan.weight.to(self.device), plan.steps.to(self.device)
        )


def host_draws(exp: Experiment) -> None:
    """Make a (CUDA) experiment draw its minibatches like the CPU run (:class:`HostSampler`)."""
    ctx = exp.ctx
    ctx.sampler = HostSampler(ctx.sampler, ctx.generator, ctx.device)


def own_sampler_stream(exp: Experiment) -> None:
    """Make a CPU experiment draw its minibatches from a generator of their own, as a CUDA run
    does (seeded as ``fedhp/build.py`` seeds the CUDA one; its draws differ all the same)."""
    ctx = exp.ctx
    ctx.sampler = ctx.sampler.with_generator(
        torch.Generator().manual_seed(exp.cfg.seed + ENGINE_SEED_OFFSET + 1)
    )


def config(device: str, overrides: list[str]) -> RunConfig:
    """The run's configuration: :data:`BASE`, the device, :data:`DNN` unless ``overrides``
    name a model, then ``overrides``."""
    model = [] if any(o.startswith("model.name=") for o in overrides) else DNN
    return resolve_config(None, [*BASE, f"device={device}", *model, *overrides])


Prepare = Callable[[Experiment], None]


class Run:
    """One round of an experiment on one device, run by the runner, and what it left: the
    state before and after the round, the round's statistics, the global and personalized
    models (or pFedGP's personalized evaluation) and the metrics row."""

    def __init__(
        self,
        device: str,
        overrides: list[str],
        out: Path,
        monkeypatch: pytest.MonkeyPatch,
        prepare: Prepare | None = None,
    ) -> None:
        monkeypatch.setattr(build, "partition_data", fabricated)
        self.exp = exp = build_experiment(config(device, overrides))
        assert exp.ctx.device.type == torch.device(device).type
        assert exp.ctx.fed.train.x.device.type == torch.device(device).type
        if prepare is not None:
            prepare(exp)
        algo = exp.algorithm
        seen: dict[str, Any] = {}
        original = algo.run_round

        def spy(state: dict[str, torch.Tensor], rnd: int) -> dict[str, float]:
            seen["before"] = {k: v.detach().clone() for k, v in state.items()}
            seen["stats"] = original(state, rnd)
            seen["state"] = state
            return seen["stats"]

        monkeypatch.setattr(algo, "run_round", spy)
        run_experiment(exp, out)
        state: dict[str, torch.Tensor] = seen["state"]
        self.before: dict[str, torch.Tensor] = seen["before"]
        self.stats: dict[str, float] = seen["stats"]
        self.state = {k: v.detach().cpu() for k, v in state.items()}
        glob, personal = algo.global_model(state), algo.personal_models(state)
        self.global_model = None if glob is None else glob.detach().cpu()
        self.personal = None if personal is None else personal.detach().cpu()
        probed = [m for m in (glob, personal) if m is not None]
        if not probed and "global" in state:  # pFedGP: no model classifies alone; its network
            probed = [state["global"]]  # (the features it trains and sends) is state["global"]
        self.model_devices = [m.device.type for m in probed]
        custom = algo.personal_evaluation(state, exp.ctx.fed.test)
        self.personal_eval = None if custom is None else (custom.correct, custom.loss_sum)
        with (out / "metrics.csv").open() as fh:
            self.row = list(csv.DictReader(fh))[-1]


def run_pair(
    overrides: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    prepare_cpu: Prepare | None = None,
    prepare_cuda: Prepare | None = None,
) -> tuple[Run, Run]:
    """The same round on the CPU and on CUDA."""
    cpu = Run("cpu", overrides, tmp_path / "cpu", monkeypatch, prepare_cpu)
    cuda = Run("cuda", overrides, tmp_path / "cuda", monkeypatch, prepare_cuda)
    return cpu, cuda


def full_batch_pair(
    overrides: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Run, Run]:
    """A round of full minibatches on both devices (the CPU's from a stream of their own)."""
    return run_pair(
        [*overrides, *FULL_BATCH], tmp_path, monkeypatch, prepare_cpu=own_sampler_stream
    )


def full_batch_pair_on(
    devices: list[str], overrides: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> list[Run]:
    """:func:`full_batch_pair`'s runs on ``devices`` (e.g. the CPU alone, where no GPU is)."""
    full = [*overrides, *FULL_BATCH]
    tmp_path.mkdir(parents=True, exist_ok=True)
    return [
        Run(d, full, tmp_path / d, monkeypatch, own_sampler_stream if d == "cpu" else None)
        for d in devices
    ]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """``actual`` (CUDA's) within 1e-4 of ``expected`` (the CPU's); failures name ``what``."""

    def message(detail: str) -> str:
        return f"{what}: {detail}"

    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL, msg=message)


def assert_agree(
    cpu: Run,
    cuda: Run,
    reference: torch.Tensor | None = None,
    native: torch.Tensor | None = None,
) -> None:
    """The CUDA run matches the CPU run to 1e-4 — and really ran on the GPU, and really trained.
    ``reference`` (a float64 global model): the global models (and ``state["global"]``) are
    compared with it instead, each device within the bound set by the CPU's float32 rounds (the
    engine's and ``native``, the round through the CPU's native convolutions;
    :func:`assert_as_accurate`)."""
    assert cuda.model_devices and set(cuda.model_devices) == {"cuda"}, cuda.model_devices
    assert cpu.global_model is not None or cpu.personal is not None or cpu.personal_eval
    if reference is not None:
        assert cpu.global_model is not None and cuda.global_model is not None
        start = cpu.before["global"].cpu()
        results = {"cpu": cpu.global_model, "cuda": cuda.global_model}
        if native is not None:
            results["cpu-native"] = native
        assert_as_accurate(results, reference, start, tuple(k for k in results if k != "cuda"))
    for name, a, b in (
        ("global model", cpu.global_model, cuda.global_model),
        ("personalized models", cpu.personal, cuda.personal),
    ):
        assert (a is None) == (b is None), name
        if a is not None and b is not None and (reference is None or name != "global model"):
            assert_close(b, a, name)
    if cpu.personal_eval is not None:
        assert cuda.personal_eval is not None
        assert_close(cuda.personal_eval[1], cpu.personal_eval[1], "personalized test losses")
    assert cpu.state.keys() == cuda.state.keys()
    for key, a in cpu.state.items():
        b = cuda.state[key]
        if reference is not None and key == "global":
            continue  # compared with the float64 reference above
        if a.is_floating_point():
            assert_close(b, a, f"state[{key!r}]")
        else:
            assert torch.equal(b, a), f"state[{key!r}] differs"
    moved = [
        k
        for k, a in cpu.state.items()
        if a.is_floating_point() and k in cpu.before and a.shape == cpu.before[k].shape
        if (a.double() - cpu.before[k].cpu().double()).abs().max() > 1e-5
    ]
    assert moved, "the round changed no state entry: the comparison would be vacuous"
    assert cpu.stats.keys() == cuda.stats.keys()
    for key, value in cpu.stats.items():
        assert math.isclose(cuda.stats[key], value, rel_tol=RTOL, abs_tol=ATOL), key
    assert cpu.row.keys() == cuda.row.keys()
    losses = [k for k in cpu.row if k.endswith("loss") and cpu.row[k] != ""]
    assert losses, "no evaluated loss in metrics.csv"
    for key in losses:
        cpu_value, cuda_value = float(cpu.row[key]), float(cuda.row[key])
        assert math.isclose(cuda_value, cpu_value, rel_tol=RTOL, abs_tol=ATOL), key


def algorithm_overrides(name: str) -> list[str]:
    return [f"algorithm.name={name}", *ALGORITHM_OPTIONS.get(name, ["algorithm.local_steps=2"])]


@pytest.mark.parametrize("name", sorted(ALGORITHMS.names()))
def test_every_algorithm_agrees_with_the_cpu_after_a_round(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_agree(*full_batch_pair(algorithm_overrides(name), tmp_path, monkeypatch))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_engine_paths_agree_with_the_cpu(
    variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = VARIANTS[variant]
    if not any(o.startswith("algorithm.name=") for o in overrides):
        overrides = ["algorithm.name=fedavg", *overrides]
    assert_agree(*full_batch_pair(overrides, tmp_path, monkeypatch))


@pytest.mark.parametrize("model", MODEL_CASES)
def test_every_model_agrees_with_the_cpu_under_fedavg(
    model: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = ["algorithm.name=fedavg", "algorithm.local_steps=2", *model]
    cpu, cuda = full_batch_pair(overrides, tmp_path, monkeypatch)
    init = cpu.exp.model.init_params(cpu.exp.cfg.seed + MODEL_SEED_OFFSET)
    reference = native = None
    if "model.name=resnet18" in model:  # entry-wise tolerances do not fit: see the docstring
        lr, train = cpu.exp.options.lr, cpu.exp.ctx.fed.train  # type: ignore[attr-defined]
        reference = fedavg_round_reference(cpu.exp.model, init, train, 2, lr)
        native = cpu_float32_rounds(cpu.exp.model, init, train, 2, lr)["loop32-native"]
    assert_agree(cpu, cuda, reference, native)
    assert cpu.global_model is not None
    assert (cpu.global_model - init).abs().max() > 1e-4  # the round trained the model


@pytest.mark.parametrize("case", sorted(MINIBATCH_CASES))
def test_partial_minibatches_drawn_alike_agree_with_the_cpu(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Minibatches of 5 of a client's 12 samples: the CUDA run draws them on the host from the
    engine generator (:class:`HostSampler`), so both runs train on the same minibatches."""
    overrides = [*MINIBATCH_CASES[case], "algorithm.batch_size=5"]
    assert_agree(*run_pair(overrides, tmp_path, monkeypatch, prepare_cuda=host_draws))


def test_cuda_runs_draw_from_a_seeded_cuda_generator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's own CUDA minibatch draws (the stream the tests above work around): seeded
    (two runs agree) and checkpointed (the sampler's and CUDA's generator states are in
    checkpoint.pt)."""
    overrides = ["algorithm.name=fedavg", "algorithm.local_steps=3", "algorithm.batch_size=5"]
    first = Run("cuda", overrides, tmp_path / "a", monkeypatch)
    again = Run("cuda", overrides, tmp_path / "b", monkeypatch)
    assert first.global_model is not None and again.global_model is not None
    torch.testing.assert_close(again.global_model, first.global_model)
    rng = load_checkpoint(tmp_path / "a" / CHECKPOINT_FILE)["rng"]
    assert {"engine", "sampler", "torch"} <= rng.keys() and any(k.startswith("cuda") for k in rng)


def test_the_cuda_policy_trains_all_clients_in_one_chunk_within_its_budget() -> None:
    """The run's policy on CUDA: a budget from the free memory; 2,000 DNN-100 clients train in
    one chunk (the CPU's policy: chunks of 31), and the chunk's peak memory stays within the
    budget the policy assumed for it."""
    device = torch.device("cuda")
    model = MODELS.build({"name": "dnn", "hidden": [100]}, "model").build((1, 28, 28), 10)
    model.policy = policy = build_policy(device, model.reference, (1, 28, 28), batch_size=5)
    assert policy.device_type == "cuda" and policy.budget_bytes is not None
    clients = 2000
    assert policy.chunk(model.num_params, clients) == clients
    assert ExecutionPolicy().chunk(model.num_params, clients) == 31
    calls: list[int] = []
    step = model.sgd_step

    def spy(flat, x, y, lr, before=None):  # type: ignore[no-untyped-def]
        calls.append(flat.shape[0])
        return step(flat, x, y, lr, before)

    model.sgd_step = spy  # type: ignore[method-assign]
    x = torch.randn(clients, 5, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (clients, 5), device=device)
    w0 = model.init_params(0).to(device).expand(clients, -1)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out, _ = sgd_steps(model, w0, lambda: (x, y), 5, 0.1)
    torch.cuda.synchronize()
    assert calls == [clients] * 5 and out.isfinite().all()
    used = torch.cuda.max_memory_allocated() - base
    assert used <= clients * ROW_COPIES * 4 * model.num_params + clients * policy.client_bytes


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_lower_precisions_land_near_fp32(
    precision: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FedAvg round of a conv net at ``precision`` on CUDA lands within 5 % of the fp32
    round's update of the fp32 CUDA round (and not on it for bf16)."""
    model = [*TINY_VGG, "model.batch_norm=true"]
    overrides = ["algorithm.name=fedavg", "algorithm.local_steps=2", *model]
    fp32, low = (
        full_batch_pair_on(["cuda"], [*overrides, f"precision={p}"], tmp_path / p, monkeypatch)[0]
        for p in ("fp32", precision)
    )
    assert low.exp.ctx.policy.precision == precision
    assert fp32.global_model is not None and low.global_model is not None
    start = fp32.before["global"].cpu()
    moved = (fp32.global_model - start).norm()
    gap = (low.global_model - fp32.global_model).norm()
    assert gap < 0.05 * moved, (gap, moved)
    if precision == "bf16":
        assert gap > 0


@pytest.mark.parametrize("method", ["sfedhp", "pfedme"])
def test_cuda_graphs_replay_theta_steps_as_the_eager_run_computes_them(
    method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``engine.cuda_graphs=true``: sFedHP's and pFedMe's θ steps are captured as CUDA graphs
    (no key falls back to eager) and replayed every local round after the first, and three
    rounds land where the same rounds without graphs land (the replay runs the captured kernels
    on the same values: equal up to float32 rounding of cuBLAS's choices)."""
    over = [f"algorithm.name={method}", "algorithm.R=3", "algorithm.K=2", "rounds=3"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedhpWarning)  # a fallback to eager fails the test
        eager = Run("cuda", over, tmp_path / "eager", monkeypatch)
        graphed = Run("cuda", [*over, "engine.cuda_graphs=true"], tmp_path / "graphs", monkeypatch)
    graphs = graphed.exp.ctx.graphs
    assert graphs.enabled and graphs.graphs and not graphs.eager
    assert graphs.replays >= 3 * 3 and not eager.exp.ctx.graphs.enabled
    for key in ("theta", "edge", "global"):
        if key in eager.state:
            torch.testing.assert_close(graphed.state[key], eager.state[key], rtol=1e-5, atol=1e-6)
