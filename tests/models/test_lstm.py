"""The batched character LSTM against its reference ``nn.Module`` (forward, gradients, a FedAvg
round, FLOPs), gradient clipping against ``torch.nn.utils.clip_grad_norm_``, and unit masks over
its hidden units against a smaller LSTM."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from fedhp.engine.ops import sgd_steps, weighted_mean, weighted_sgd_steps
from fedhp.engine.reference import reference_fedavg_round
from fedhp.errors import ConfigError
from fedhp.models import MODELS, BatchedModel
from fedhp.models import lstm as lstm_module
from fedhp.models.clip import ClippedGradients, clip_gradients
from fedhp.models.lstm import BatchedLSTM, CharLSTM, LSTMOptions
from fedhp.models.masks import (
    masked_flops,
    num_units,
    param_mask,
    unit_mask_grad,
    unit_weight_norms,
    window_unit_mask,
)
from fedhp.models.zoo import DNNOptions

V, T = 81, 12


def lstm(hidden: int = 16, layers: int = 2, seq_len: int = T) -> BatchedLSTM:
    model = LSTMOptions(hidden=hidden, layers=layers).build((seq_len,), V)
    assert isinstance(model, BatchedLSTM)
    return model


def client_params(model: BatchedModel, clients: int) -> torch.Tensor:
    """``[C, P]``: a different initialization per client."""
    return torch.stack([model.init_params(seed) for seed in range(clients)])


def batch(
    clients: int, size: int, seq_len: int = T, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (clients, size, seq_len), dtype=torch.uint8, generator=gen)
    return x, torch.randint(0, V, (clients, size), generator=gen)


@pytest.fixture(params=["bmm", "fused"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both CPU forms of the recurrence: batched over clients (``bmm``) and per client through
    PyTorch's fused LSTM kernel (``fused``), chosen by the hidden-size threshold."""
    monkeypatch.setattr(lstm_module, "FUSED_MIN_HIDDEN", 1 if request.param == "fused" else 10**9)
    return str(request.param)


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_forward_and_gradients_equal_the_reference_module(layers: int, path: str) -> None:
    """float32, atol = rtol = 1e-5, for 3 clients with different parameters."""
    model = lstm(layers=layers)
    assert model.fused(torch.device("cpu")) == (path == "fused")
    flat = client_params(model, 3)
    x, y = batch(3, 5)
    logits = model.forward(flat, x)
    loss, grad = model.loss_and_grad(flat, x, y)
    for c in range(3):
        module = model.make_module(flat[c])
        out = module(x[c])
        ref_loss = F.cross_entropy(out, y[c])
        ref_loss.backward()
        ref_grad = torch.cat([p.grad.reshape(-1) for p in module.parameters()])  # type: ignore[union-attr]
        torch.testing.assert_close(logits[c], out.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loss[c], ref_loss.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad[c], ref_grad, atol=1e-5, rtol=1e-5)
    assert grad.abs().amax(1).min() > 0  # every client has a gradient


def test_layout_is_the_reference_modules() -> None:
    model = lstm()
    names = [s.name for s in model.layout.specs]
    assert names == [n for n, _ in CharLSTM(V, 8, 16, 2).named_parameters()]
    assert names[0] == "embedding.weight" and names[-2:] == ["fc.weight", "fc.bias"]


def test_float_indices_and_features(path: str) -> None:
    """The engine may hold the indices as float32: same logits; features are the head's input."""
    model = lstm()
    flat = client_params(model, 2)
    x, _ = batch(2, 4)
    logits, feats = model.forward_with_features(flat, x.float())
    torch.testing.assert_close(logits, model.forward(flat, x))
    assert feats.shape == (2, 4, 16)


def test_fedavg_round_equals_the_per_client_reference_path(path: str) -> None:
    model = lstm(hidden=8)
    w0 = model.init_params(0)
    batches = [batch(4, 6, seed=s) for s in range(4)]
    it = iter(batches)
    local, _ = sgd_steps(model, w0.expand(4, -1), lambda: next(it), 4, 0.5)
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0])
    vectorized = weighted_mean(local, weights)
    reference = reference_fedavg_round(model, w0, batches, 0.5, weights)
    assert (vectorized - reference).abs().max().item() < 1e-5
    assert (vectorized - w0).abs().max().item() > 1e-3  # the round moved the model


def test_flops_are_what_the_kernels_compute() -> None:
    """The formula equals PyTorch's count of the batched forward (one client, one sample), and
    the training count of ``loss_and_grad`` is 3× it."""
    h, e, layers = 16, 8, 2
    model = lstm(hidden=h, layers=layers)
    per_layer = [T * 8 * h * e + (T - 1) * 8 * h * h, T * 8 * h * h + (T - 1) * 8 * h * h]
    assert model.flops_per_sample() == sum(per_layer) + 2 * h * V
    flat = model.init_params(0).unsqueeze(0)
    x, y = batch(1, 1)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model.forward(flat, x)
    assert counter.get_total_flops() == model.flops_per_sample()
    counter = FlopCounterMode(display=False)
    with counter:
        model.loss_and_grad(flat, x, y)
    assert (
        counter.get_total_flops()
        == model.train_flops_per_sample()
        == 3 * sum(per_layer) + 3 * (2 * h * V)
    )


def test_the_fused_kernel_is_used_from_the_threshold_on_cpu() -> None:
    assert lstm(hidden=lstm_module.FUSED_MIN_HIDDEN).fused(torch.device("cpu"))
    assert not lstm(hidden=lstm_module.FUSED_MIN_HIDDEN - 1).fused(torch.device("cpu"))
    assert not lstm(hidden=lstm_module.FUSED_MIN_HIDDEN).fused(torch.device("meta"))


def test_options_need_sequences() -> None:
    with pytest.raises(ConfigError, match="model.name: 'lstm' needs sequences"):
        MODELS.get("lstm")().build((1, 28, 28), 10)


# ---------------------------------------------------------------------- gradient clipping


def reference_clipped_sgd(
    model: BatchedModel,
    flat: torch.Tensor,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    lr: float,
    max_norm: float,
) -> torch.Tensor:
    """Client by client: backward, ``clip_grad_norm_``, ``torch.optim.SGD`` step."""
    out = []
    for c in range(flat.shape[0]):
        module = model.make_module(flat[c])
        opt = torch.optim.SGD(module.parameters(), lr=lr)
        for x, y in batches:
            opt.zero_grad()
            F.cross_entropy(module(x[c]), y[c]).backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)
            opt.step()
        out.append(model.layout.flatten_module(module))
    return torch.stack(out)


@pytest.mark.parametrize("name", ["lstm", "dnn"])
def test_clipped_steps_equal_clip_grad_norm_then_sgd(name: str) -> None:
    """Per client, clipped steps (the DNN's fused step falls back to the plain one) equal
    ``clip_grad_norm_`` + SGD on its own module; the norm bites for some clients, not all."""
    if name == "lstm":
        model: BatchedModel = lstm(hidden=8)
        batches = [batch(4, 5, seed=s) for s in range(3)]
    else:
        model = DNNOptions(hidden=[7]).build((6,), 3)
        gen = torch.Generator().manual_seed(1)
        batches = [
            (torch.randn(4, 5, 6, generator=gen) * (1 + 3 * s), torch.randint(0, 3, (4, 5)))
            for s in range(3)
        ]
    flat = client_params(model, 4)
    _, grad = model.loss_and_grad(flat, *batches[0])
    norms = grad.norm(dim=1)
    max_norm = float(norms.median())
    assert (norms > max_norm).any() and (norms < max_norm).any()
    reference = reference_clipped_sgd(model, flat, batches, 0.3, max_norm)
    unclipped_type = type(model)
    clip_gradients(model, max_norm)
    assert isinstance(model, ClippedGradients) and isinstance(model, unclipped_type)
    it = iter(batches)
    out, _ = sgd_steps(model, flat, lambda: next(it), 3, 0.3)
    torch.testing.assert_close(out, reference, atol=1e-6, rtol=1e-5)
    _, clipped = model.loss_and_grad(flat, *batches[0])
    assert clipped.norm(dim=1).max() <= max_norm * (1 + 1e-5)
    _, clipped2, _ = model.loss_grad_correct(flat, *batches[0])
    torch.testing.assert_close(clipped2, clipped)  # clipped once, not twice


def test_clipping_off_leaves_the_model_alone() -> None:
    """Without ``clip_grad_norm`` the algorithm does not touch the model: its class (and so
    every step, the fused ones included) is the same, and the results are byte-identical."""
    from fedhp.api import prepare, resolve
    from tests.models.test_lstm_methods import BASE, tinytext_registered

    with tinytext_registered():
        exp = prepare(resolve({**BASE, "algorithm": {"name": "fedavg"}}))
        clip = {"name": "fedavg", "clip_grad_norm": 1.0}
        clipped = prepare(resolve({**BASE, "algorithm": clip}))
        with pytest.raises(ConfigError, match="clip_grad_norm"):
            prepare(resolve({**BASE, "algorithm": {"name": "fedavg", "clip_grad_norm": 0}}))
    assert type(exp.model) is BatchedLSTM
    assert isinstance(clipped.model, ClippedGradients) and clipped.model.clip_grad_norm == 1.0


# ---------------------------------------------------------------------- unit masks


def keep_units(model: BatchedLSTM, kept: list[list[int]]) -> torch.Tensor:
    """A ``[1, U]`` unit mask keeping ``kept[layer]``."""
    mask = torch.zeros(1, num_units(model), dtype=torch.bool)
    for layer, units in enumerate(kept):
        mask[0, [layer * model.hidden + j for j in units]] = True
    return mask


def smaller(model: BatchedLSTM, flat: torch.Tensor, kept: list[list[int]]) -> CharLSTM:
    """The LSTM without the dropped units (same number kept in every layer)."""
    h, k = model.hidden, len(kept[0])
    small = CharLSTM(V, model.embed_dim, k, model.layers)
    params = model.layout.unflatten(flat)
    state = {"embedding.weight": params["embedding.weight"]}
    prev: list[int] | None = None
    for layer, units in enumerate(kept):
        rows = [g * h + j for g in range(4) for j in units]
        w_ih = params[f"lstm.weight_ih_l{layer}"][rows]
        state[f"lstm.weight_ih_l{layer}"] = w_ih if prev is None else w_ih[:, prev]
        state[f"lstm.weight_hh_l{layer}"] = params[f"lstm.weight_hh_l{layer}"][rows][:, units]
        for b in ("bias_ih", "bias_hh"):
            state[f"lstm.{b}_l{layer}"] = params[f"lstm.{b}_l{layer}"][rows]
        prev = units
    state["fc.weight"] = params["fc.weight"][:, prev]
    state["fc.bias"] = params["fc.bias"]
    small.load_state_dict(state)
    return small


KEPT = [[0, 2, 3, 6, 7], [1, 2, 4, 5, 6]]


@pytest.mark.parametrize("structural", [True, False])
def test_masked_lstm_is_the_smaller_lstm(structural: bool) -> None:
    """A unit mask over the hidden units: the masked model's logits equal a smaller LSTM's, its
    masked entries stay zero through masked training, and the FLOPs are the smaller model's."""
    model = lstm(hidden=8)
    units = keep_units(model, KEPT)
    pm = param_mask(model, units, structural)
    flat = model.init_params(3).unsqueeze(0) * pm
    x, y = batch(1, 6)
    ref = smaller(model, flat[0], KEPT)
    torch.testing.assert_close(model.forward(flat, x)[0], ref(x[0]).detach(), atol=1e-6, rtol=1e-5)
    small = lstm(hidden=5)
    assert int(masked_flops(model, units, structural)[0]) == small.flops_per_sample()
    dropped = pm[0] == 0
    assert int(dropped.sum()) == model.num_params - small.num_params - (0 if structural else 48)

    def draw(step: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, y = batch(1, 6, seed=step)
        return x, y, None

    trained, _ = weighted_sgd_steps(model, flat, draw, 3, 0.5, mask=pm)
    assert trained[0, dropped].abs().max() == 0
    assert (trained[0, ~dropped] - flat[0, ~dropped]).abs().max() > 1e-4
    torch.testing.assert_close(
        model.forward(trained, x)[0], smaller(model, trained[0], KEPT)(x[0]).detach()
    )


def test_structural_mask_has_no_gradient_on_dropped_units() -> None:
    """With every tensor of a dropped unit zero, its gradient is exactly zero too (so clipping
    the masked model's gradient clips the smaller model's)."""
    model = lstm(hidden=8)
    pm = param_mask(model, keep_units(model, KEPT), structural=True)
    flat = model.init_params(1).unsqueeze(0) * pm
    _, grad = model.loss_and_grad(flat, *batch(1, 6))
    assert grad[0, pm[0] == 0].abs().max() == 0


def test_unit_scores_and_windows() -> None:
    """FedLPS's per-unit signals cover a unit's gate rows (and its columns for ∂L/∂m);
    HeteroFL's window masks keep each layer's first units."""
    model = lstm(hidden=4, layers=2)
    flat = client_params(model, 2)
    norms = unit_weight_norms(model, flat)
    params = model.layout.unflatten(flat)
    j = 2
    rows = [g * 4 + j for g in range(4)]
    expect = params["lstm.weight_ih_l1"][:, rows].abs().sum((1, 2))
    expect = expect + params["lstm.weight_hh_l1"][:, rows].abs().sum((1, 2))
    torch.testing.assert_close(norms[:, 4 + j], expect)
    grad = torch.randn_like(flat)
    sig = unit_mask_grad(model, flat, grad, structural=False)
    prod = model.layout.unflatten(flat * grad)
    expect = prod["lstm.weight_ih_l0"][:, rows].sum((1, 2))
    expect = expect + prod["lstm.weight_hh_l0"][:, rows].sum((1, 2))
    expect = expect + prod["lstm.weight_hh_l0"][:, :, j].sum(1)
    expect = expect + prod["lstm.weight_ih_l1"][:, :, j].sum(1)
    torch.testing.assert_close(sig[:, j], expect)
    window = window_unit_mask(model, torch.tensor([0.5, 1.0]))
    assert window.tolist() == [[True, True, False, False] * 2, [True] * 8]
