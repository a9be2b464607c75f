"""``model.init=tf``: FedProx's TensorFlow LSTM (one bias per gate block, forget-gate bias 1.0,
Glorot-uniform weights) — its parameter count, layout, initialization, a hand-written LSTM step,
the batched model against the per-client module, unit masks, and bad values."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedhp.errors import ConfigError
from fedhp.models import MODELS
from fedhp.models import lstm as lstm_module
from fedhp.models.lstm import BatchedLSTM, CharLSTM, LSTMOptions
from fedhp.models.masks import param_mask
from tests.models.test_lstm import KEPT, batch, keep_units

V, T = 81, 12


def tf_lstm(hidden: int = 16, layers: int = 2, vocab: int = V) -> BatchedLSTM:
    model = LSTMOptions(hidden=hidden, layers=layers, init="tf").build((T,), vocab)
    assert isinstance(model, BatchedLSTM)
    return model


@pytest.fixture(params=["bmm", "fused"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both CPU forms of the recurrence (as in test_lstm.py)."""
    monkeypatch.setattr(lstm_module, "FUSED_MIN_HIDDEN", 1 if request.param == "fused" else 10**9)
    return str(request.param)


def test_parameter_counts_at_fedprox_size() -> None:
    """Embedding 8 → 2 × LSTM 256 → linear: FedProx's TF model has 817,872 parameters for LEAF's
    80 classes; fedhp's 81 add one embedding row (8) and one output row (257)."""
    counts = {
        (init, vocab): LSTMOptions(init=init).build((80,), vocab).num_params
        for init in ("torch", "tf")
        for vocab in (80, 81)
    }
    assert counts[("tf", 80)] == 817_872
    assert counts[("tf", 81)] == 818_137 == 817_872 + 8 + 257
    assert counts[("torch", 81)] == 820_185 == 818_137 + 2 * 4 * 256  # a second bias per layer


def test_layout_one_bias_per_layer() -> None:
    model = tf_lstm()
    names = [s.name for s in model.layout.specs]
    assert names == [n for n, _ in CharLSTM(V, 8, 16, 2, init="tf").named_parameters()]
    assert names == [
        "embedding.weight",
        *(f"lstm.{k}_l{i}" for i in range(2) for k in ("weight_ih", "weight_hh", "bias")),
        "fc.weight",
        "fc.bias",
    ]
    assert model.layout.size == model.num_params == sum(s.numel for s in model.layout.specs)


def test_tf_initialization() -> None:
    """Forget-gate block of each bias 1.0, the rest and the output bias 0; weights uniform within
    TensorFlow's Glorot bound (kernel [in + H, 4H], embedding [V, E], dense [H, V]) and filling
    it; seeded: same seed, same parameters."""
    h, e = 64, 8
    model = tf_lstm(hidden=h)
    flat = model.init_params(0)
    assert torch.equal(flat, model.init_params(0))
    assert not torch.equal(flat, model.init_params(1))
    p = model.layout.unflatten(flat.unsqueeze(0))
    for layer in range(2):
        bias = p[f"lstm.bias_l{layer}"][0]
        assert torch.equal(bias[h : 2 * h], torch.ones(h))  # i, f, g, o: f is the second block
        assert bias[:h].abs().max() == 0 and bias[2 * h :].abs().max() == 0
    assert p["fc.bias"].abs().max() == 0
    bounds = {
        "embedding.weight": math.sqrt(6 / (V + e)),
        "lstm.weight_ih_l0": math.sqrt(6 / (e + h + 4 * h)),
        "lstm.weight_hh_l0": math.sqrt(6 / (e + h + 4 * h)),
        "lstm.weight_ih_l1": math.sqrt(6 / (2 * h + 4 * h)),
        "lstm.weight_hh_l1": math.sqrt(6 / (2 * h + 4 * h)),
        "fc.weight": math.sqrt(6 / (h + V)),
    }
    for name, bound in bounds.items():
        w = p[name]
        assert w.abs().max() <= bound, name
        assert w.abs().max() > 0.95 * bound, name  # uniform over the whole range
        assert abs(float(w.std()) - bound / math.sqrt(3)) < 0.1 * bound, name
    torch_flat = LSTMOptions(hidden=h).build((T,), V).init_params(0)
    assert torch_flat.numel() == flat.numel() + 2 * 4 * h  # a different layout and draw


def manual_lstm(model: BatchedLSTM, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Logits of one client from the LSTM equations written out: gates = W_ih x + W_hh h + b in
    the order i, f, g, o; c = σ(f)·c + σ(i)·tanh(g); h = σ(o)·tanh(c)."""
    p = {k: v[0] for k, v in model.layout.unflatten(flat.unsqueeze(0)).items()}
    seq = p["embedding.weight"][x.long()]  # [B, T, E]
    h_size = model.hidden
    for layer in range(model.layers):
        h = seq.new_zeros(seq.shape[0], h_size)
        c = torch.zeros_like(h)
        outs = []
        for t in range(seq.shape[1]):
            gates = (
                seq[:, t] @ p[f"lstm.weight_ih_l{layer}"].T
                + h @ p[f"lstm.weight_hh_l{layer}"].T
                + p[f"lstm.bias_l{layer}"]
            )
            i, f, g, o = gates.split(h_size, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        seq = torch.stack(outs, dim=1)
    return seq[:, -1] @ p["fc.weight"].T + p["fc.bias"]


@pytest.mark.parametrize("layers", [1, 2])
def test_batched_equals_per_client_module_and_the_equations(layers: int, path: str) -> None:
    """float32, 3 clients with different parameters: the batched forward and gradients equal the
    reference module's (:class:`OneBiasLSTM` through ``torch.lstm``), whose logits equal the
    equations written out (so the one bias enters once and block 2 is the forget gate)."""
    model = tf_lstm(layers=layers)
    assert model.fused(torch.device("cpu")) == (path == "fused")
    flat = torch.stack([model.init_params(s) for s in range(3)])
    flat = flat + 0.1 * torch.randn(flat.shape, generator=torch.Generator().manual_seed(0))
    x, y = batch(3, 5)
    logits = model.forward(flat, x)
    loss, grad = model.loss_and_grad(flat, x, y)
    for c in range(3):
        module = model.make_module(flat[c])
        assert isinstance(module, CharLSTM) and module.init == "tf"
        out = module(x[c])
        ref_loss = F.cross_entropy(out, y[c])
        ref_loss.backward()
        ref_grad = torch.cat([q.grad.reshape(-1) for q in module.parameters()])  # type: ignore[union-attr]
        torch.testing.assert_close(logits[c], out.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loss[c], ref_loss.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad[c], ref_grad, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            manual_lstm(model, flat[c], x[c]), logits[c], atol=1e-5, rtol=1e-5
        )
    names = [s.name for s in model.layout.specs]
    per_bias = model.layout.unflatten(grad)["lstm.bias_l0"]
    assert "lstm.bias_l0" in names and per_bias.abs().amax(1).min() > 0  # the bias is trained


def test_flops_formula_holds_for_tf() -> None:
    """Same matrix products as torch's layout: the FLOP count does not depend on ``init``."""
    assert tf_lstm().flops_per_sample() == LSTMOptions(hidden=16).build((T,), V).flops_per_sample()


def test_masked_tf_lstm_is_the_smaller_tf_lstm() -> None:
    """A structural unit mask zeroes the dropped units' rows of the single bias too: the masked
    model's logits equal a smaller TF-layout LSTM's."""
    model = tf_lstm(hidden=8)
    pm = param_mask(model, keep_units(model, KEPT), structural=True)
    flat = (model.init_params(3) + 0.1).unsqueeze(0) * pm  # biases non-zero everywhere first
    params = model.layout.unflatten(flat)
    h, k = model.hidden, len(KEPT[0])
    dropped = [j for j in range(h) if j not in KEPT[0]]
    assert (
        params["lstm.bias_l0"][0, [g * h + j for g in range(4) for j in dropped]].abs().max() == 0
    )
    small = CharLSTM(V, model.embed_dim, k, model.layers, init="tf")
    state = {"embedding.weight": params["embedding.weight"][0]}
    prev: list[int] | None = None
    for layer, units in enumerate(KEPT):
        rows = [g * h + j for g in range(4) for j in units]
        w_ih = params[f"lstm.weight_ih_l{layer}"][0][rows]
        state[f"lstm.weight_ih_l{layer}"] = w_ih if prev is None else w_ih[:, prev]
        state[f"lstm.weight_hh_l{layer}"] = params[f"lstm.weight_hh_l{layer}"][0][rows][:, units]
        state[f"lstm.bias_l{layer}"] = params[f"lstm.bias_l{layer}"][0][rows]
        prev = units
    state["fc.weight"] = params["fc.weight"][0][:, prev]
    state["fc.bias"] = params["fc.bias"][0]
    small.load_state_dict(state)
    x, _ = batch(1, 6)
    torch.testing.assert_close(
        model.forward(flat, x)[0], small(x[0]).detach(), atol=1e-6, rtol=1e-5
    )


@pytest.mark.parametrize("value", ["keras", "TF", 1])
def test_bad_init_is_a_one_line_error(value: object) -> None:
    with pytest.raises(ConfigError) as err:
        MODELS.build({"name": "lstm", "init": value}, "model")
    text = str(err.value)
    assert "\n" not in text and text.startswith("model.init") and "'tf'" in text, text
    with pytest.raises(ConfigError, match=r"^model.init: unknown 'keras'; use one of torch, tf$"):
        CharLSTM(V, 8, 4, 1, init="keras")
