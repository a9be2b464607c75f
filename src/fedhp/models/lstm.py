"""The character LSTM of LEAF's Shakespeare task (embedding → stacked LSTM → linear on the last
time step), in the batched ``[C, P]`` form.

Inputs are character indices ``x [C, B, T]`` (uint8, or any dtype holding whole numbers; the
model embeds ``x.long()``), labels the next character's index. Every client's parameters are a row
of the flat ``[C, P]`` tensor, laid out as the reference ``nn.Module``'s ``named_parameters()``
(``embedding.weight``, ``lstm.weight_ih_l0``, ``lstm.weight_hh_l0``, ``lstm.bias_ih_l0``,
``lstm.bias_hh_l0``, ... , ``fc.weight``, ``fc.bias``; PyTorch's gate order i, f, g, o).
``model.init=tf`` is FedProx's TensorFlow model instead: one bias per layer (``lstm.bias_l0``
where ``nn.LSTM`` has ``bias_ih_l0`` and ``bias_hh_l0``), forget-gate block of it 1.0,
Glorot-uniform weights (:class:`OneBiasLSTM`, :meth:`CharLSTM.reset_tf`); with 81 classes the
default sizes have 818,137 parameters (FedProx's 817,872 for 80) against 820,185 for ``torch``.

On the CPU from :data:`FUSED_MIN_HIDDEN` (64) hidden units on, each client's layers run through
``torch.lstm`` (what ``nn.LSTM`` calls: oneDNN's fused LSTM kernel, measured faster there
than the ``bmm`` recurrence below) on that client's weight views, autograd supplying
the backward; the embedding lookup, output layer, loss and the SGD update of all ``[C, P]`` rows
stay batched. Below it, and on other devices, the batched form below (measured with
``benchmarks/bench_lstm.py``; results in docs/results/bench-lstm.txt).

The batched forward runs every client at once: the embedding is one lookup in the clients'
stacked tables, each layer's input projection for all time steps is one ``baddbmm`` over the
client dimension, and the recurrence is one ``baddbmm`` per time step (``[C, B, 4H]`` gates).
The recurrence has a hand-written backward (:class:`_Recurrence`): per step one ``bmm`` for the
hidden state's gradient, and the recurrent weights' gradient as one ``bmm`` over all time steps at
the end (autograd would take a small ``mm`` per step); the rest is autograd.

FLOPs (2 per multiply-add, what the kernels compute; the embedding lookup is free): per sample
``T·8H·in + (T-1)·8H·H`` per layer (the first step's recurrent product is skipped: h₀ = 0) plus
``2·H·V`` for the output layer, once; training is 3× that (the first layer's input gradient is
computed too: the embedding is trained).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import pydantic
import torch
import torch.nn.functional as F
from torch import nn

from fedhp.errors import ConfigError
from fedhp.models.base import BatchedModel, FeatureOptions, ForwardOptions, Params
from fedhp.models.feature_net import FeatureNet
from fedhp.models.masks import UnitGroup
from fedhp.models.zoo import MODELS, ModelOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

FUSED_MIN_HIDDEN = 64
"""From this many hidden units on, the CPU forward runs each client through the fused kernel
(:meth:`BatchedLSTM.fused`)."""


INITS = ("torch", "tf")
"""``model.init`` of the LSTM: PyTorch's layout and initialization, or FedProx's TensorFlow one."""


class OneBiasLSTM(nn.Module):
    """A stacked LSTM with one bias vector per layer (TensorFlow's ``BasicLSTMCell``), in
    PyTorch's layout otherwise: ``weight_ih_l{k} [4H, in]``, ``weight_hh_l{k} [4H, H]``,
    ``bias_l{k} [4H]``, gate order i, f, g, o. Runs through ``torch.lstm`` with a zero second
    bias, so it computes exactly ``nn.LSTM`` with ``bias_ih = bias_l{k}``, ``bias_hh = 0``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        for k in range(num_layers):
            inp = input_size if k == 0 else hidden_size
            self.register_parameter(
                f"weight_ih_l{k}", nn.Parameter(torch.empty(4 * hidden_size, inp))
            )
            self.register_parameter(
                f"weight_hh_l{k}", nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
            )
            self.register_parameter(f"bias_l{k}", nn.Parameter(torch.empty(4 * hidden_size)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """TensorFlow's ``BasicLSTMCell`` initialization (:func:`tf_init_lstm_`)."""
        tf_init_lstm_(self)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        """``(outputs [B, T, H], None)`` for ``x [B, T, in]`` (batch first, h₀ = c₀ = 0)."""
        zeros = x.new_zeros(self.num_layers, x.shape[0], self.hidden_size)
        weights = []
        for k in range(self.num_layers):
            bias = getattr(self, f"bias_l{k}")
            weights += [
                getattr(self, f"weight_ih_l{k}"),
                getattr(self, f"weight_hh_l{k}"),
                bias,
                torch.zeros_like(bias),
            ]
        out = torch.lstm(
            x, (zeros, zeros), weights, True, self.num_layers, 0.0, self.training, False, True
        )[0]
        return out, None


def _glorot_(w: torch.Tensor, fan_in: int, fan_out: int) -> None:
    """``w`` ← U(−a, a), a = √(6 / (fan_in + fan_out)) (TensorFlow's ``glorot_uniform``)."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        w.uniform_(-bound, bound)


def tf_init_lstm_(lstm: OneBiasLSTM) -> None:
    """TF1's ``BasicLSTMCell`` as FedProx builds it: each layer's kernel ``[in + H, 4H]`` (here
    ``weight_ih`` and ``weight_hh``, the same distribution) Glorot-uniform over that whole
    kernel, the bias zero but the forget block (rows ``H:2H``) 1.0 — TF adds ``forget_bias=1.0``
    to a zero-initialized bias at run time; stored here, it is the same function and gradient."""
    h = lstm.hidden_size
    for k in range(lstm.num_layers):
        inp = lstm.input_size if k == 0 else h
        _glorot_(getattr(lstm, f"weight_ih_l{k}"), inp + h, 4 * h)
        _glorot_(getattr(lstm, f"weight_hh_l{k}"), inp + h, 4 * h)
        bias = getattr(lstm, f"bias_l{k}")
        with torch.no_grad():
            bias.zero_()
            bias[h : 2 * h] = 1.0


class CharLSTM(FeatureNet):
    """The reference module: ``nn.Embedding`` → LSTM (batch first) → ``nn.Linear`` on the last
    time step's output (LEAF's and FedProx's Shakespeare model with the default sizes).

    ``init="torch"``: ``nn.LSTM`` (two bias vectors per layer) and PyTorch's default
    initialization. ``init="tf"``: FedProx's TensorFlow model (``stacked_lstm.py``:
    ``tf.get_variable`` embedding, ``MultiRNNCell`` of ``BasicLSTMCell``, ``tf.layers.dense``):
    :class:`OneBiasLSTM` (one bias per layer, forget-gate block 1.0), Glorot-uniform embedding,
    LSTM kernels and output weights, zero output bias (:meth:`reset_tf`)."""

    def __init__(
        self, vocab: int, embed_dim: int, hidden: int, layers: int, init: str = "torch"
    ) -> None:
        super().__init__()
        if init not in INITS:
            raise ConfigError(f"model.init: unknown {init!r}; use one of {', '.join(INITS)}")
        self.init = init
        self.embedding = nn.Embedding(vocab, embed_dim)
        self.lstm: nn.LSTM | OneBiasLSTM
        if init == "tf":
            self.lstm = OneBiasLSTM(embed_dim, hidden, layers)
        else:
            self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, vocab)
        if init == "tf":
            self.reset_tf()

    def reset_tf(self) -> None:
        """FedProx's TensorFlow initialization of every layer (draws from the global RNG)."""
        assert isinstance(self.lstm, OneBiasLSTM)
        vocab, embed_dim = self.embedding.weight.shape
        _glorot_(self.embedding.weight, vocab, embed_dim)  # get_variable's [V, 8]: fans V, 8
        tf_init_lstm_(self.lstm)
        hidden = self.lstm.hidden_size
        _glorot_(self.fc.weight, hidden, vocab)  # dense kernel [H, V]
        with torch.no_grad():
            self.fc.bias.zero_()

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(x.long()))
        return out[:, -1]

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc(h)


def _run(
    xproj: torch.Tensor, w_hh: torch.Tensor, keep: bool
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The recurrence from h₀ = c₀ = 0: outputs ``[C, T, B, H]`` for the input projections
    ``xproj [C, T, B, 4H]`` (biases included) and the recurrent weights ``w_hh [C, 4H, H]``;
    with ``keep``, each step's sigmoid of all gates, tanh of the g gate, cell state and
    tanh(cell state) (for the backward). Each step reads and writes ``[C, B, ..]`` slices of the
    client-major tensors (contiguous per client)."""
    c_, t_len, b, g4 = xproj.shape
    hidden = g4 // 4
    w_t = w_hh.transpose(1, 2).contiguous()  # once: bmm would copy a transposed operand each step
    outs: list[torch.Tensor] = []
    kept: list[torch.Tensor] = []
    c: torch.Tensor | None = None
    for t in range(t_len):
        gates = xproj[:, t] if t == 0 else torch.baddbmm(xproj[:, t], outs[-1], w_t)
        sig = torch.sigmoid(gates)  # i, f, o (the g block's sigmoid is not used)
        g = torch.tanh(gates[..., 2 * hidden : 3 * hidden])
        i, f, o = sig[..., :hidden], sig[..., hidden : 2 * hidden], sig[..., 3 * hidden :]
        c = i * g if c is None else torch.addcmul(i * g, f, c)
        tc = torch.tanh(c)
        outs.append(o * tc)
        if keep:
            kept += [sig, g, c, tc]
    return torch.stack(outs, dim=1), kept


class _Recurrence(torch.autograd.Function):
    """One LSTM layer's recurrence with a hand-written backward (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, xproj: torch.Tensor, w_hh: torch.Tensor) -> torch.Tensor:
        hs, kept = _run(xproj, w_hh, keep=True)
        ctx.save_for_backward(w_hh, hs, *kept)
        return hs

    @staticmethod
    def backward(ctx: Any, d_hs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w_hh, hs, *kept = ctx.saved_tensors
        c_, t_len, b, hidden = hs.shape
        d_pre: list[torch.Tensor] = []  # d loss / d gate pre-activations, from the last step
        dh: torch.Tensor | None = None
        dc: torch.Tensor | None = None
        blocks = [slice(k * hidden, (k + 1) * hidden) for k in range(4)]
        for t in reversed(range(t_len)):
            sig, g, _, tc = kept[4 * t : 4 * t + 4]
            grad_h = d_hs[:, t] if dh is None else d_hs[:, t] + dh
            d_tc = grad_h * sig[..., blocks[3]]
            grad_c = torch.addcmul(d_tc, d_tc, tc * tc, value=-1)  # d_tc · (1 - tanh²)
            if dc is not None:
                grad_c += dc
            slope = torch.addcmul(sig, sig, sig, value=-1)  # σ' = σ(1 - σ)
            d_i = grad_c * g * slope[..., blocks[0]]
            d_f = grad_c * kept[4 * t - 2] * slope[..., blocks[1]] if t > 0 else grad_c * 0
            d_g = grad_c * sig[..., blocks[0]]
            d_g = torch.addcmul(d_g, d_g, g * g, value=-1)
            d_o = grad_h * tc * slope[..., blocks[3]]
            d_t = torch.cat((d_i, d_f, d_g, d_o), dim=-1)
            d_pre.append(d_t)
            if t > 0:
                dh = torch.bmm(d_t, w_hh)
                dc = grad_c * sig[..., blocks[1]]
        d_all = torch.stack(d_pre[::-1], dim=1)  # [C, T, B, 4H]
        d_w = torch.zeros_like(w_hh)
        if t_len > 1:  # one product over every step: sum_t d_pre[t]^T h[t-1] per client
            rows = d_all[:, 1:].reshape(c_, (t_len - 1) * b, 4 * hidden)
            prev = hs[:, :-1].reshape(c_, (t_len - 1) * b, hidden)
            torch.bmm(rows.transpose(1, 2), prev, out=d_w)
        return d_all, d_w


class BatchedLSTM(BatchedModel):
    """:class:`CharLSTM` for many clients at once (see the module docstring)."""

    def __init__(self, reference: CharLSTM, feature_shape: tuple[int, ...], num_classes: int):
        super().__init__(reference, feature_shape, num_classes)
        self.vocab = reference.embedding.num_embeddings
        self.embed_dim = reference.embedding.embedding_dim
        self.hidden = reference.lstm.hidden_size
        self.layers = reference.lstm.num_layers
        self.seq_len = feature_shape[0]
        self.init = reference.init

    def bias_names(self, layer: int) -> tuple[str, ...]:
        """The bias vectors of ``layer``: ``bias_ih``/``bias_hh`` (torch) or ``bias`` (tf)."""
        if self.init == "tf":
            return (f"lstm.bias_l{layer}",)
        return (f"lstm.bias_ih_l{layer}", f"lstm.bias_hh_l{layer}")

    def init_params(self, seed: int) -> torch.Tensor:
        """Initial flat ``[P]`` parameters: PyTorch's default init (``torch``) or FedProx's
        TensorFlow one (``tf``, :meth:`CharLSTM.reset_tf`)."""
        if self.init != "tf":
            return super().init_params(seed)
        reference = self.reference
        assert isinstance(reference, CharLSTM)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            reference.reset_tf()
            return self.layout.flatten_module(reference).clone()

    # ------------------------------------------------------------------ forward
    def forward(
        self, flat: torch.Tensor, x: torch.Tensor, **opts: Unpack[ForwardOptions]
    ) -> torch.Tensor:
        return self.forward_params(self.layout.unflatten(flat), x)

    def forward_params(
        self, params: Params, x: torch.Tensor, **opts: Unpack[FeatureOptions]
    ) -> torch.Tensor:
        return self._head(params, self._features(params, x))

    def forward_with_features(
        self, flat: torch.Tensor, x: torch.Tensor, **opts: Unpack[FeatureOptions]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        params = self.layout.unflatten(flat)
        h = self._features(params, x)
        return self._head(params, h), h

    def _head(self, params: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        w, b = params["fc.weight"], params["fc.bias"]
        return torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))

    def _features(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The last layer's output at the last time step ``[C, B, H]``."""
        if self.fused(x.device):
            return self._features_fused(params, x)
        return self._features_bmm(params, x)

    def fused(self, device: torch.device) -> bool:
        """Whether the recurrence runs through PyTorch's fused LSTM kernel, one client at a time
        (:meth:`_features_fused`) rather than batched over clients (:meth:`_features_bmm`): on
        the CPU from :data:`FUSED_MIN_HIDDEN` hidden units on (measured, ``bench_lstm.py``)."""
        return device.type == "cpu" and self.hidden >= FUSED_MIN_HIDDEN

    def _features_fused(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """:meth:`_features` with each client's layers through ``torch.lstm`` (what ``nn.LSTM``
        calls: oneDNN's fused LSTM on the CPU) on that client's weight views; the embedding
        lookup stays batched and autograd supplies the backward."""
        table = params["embedding.weight"]  # [C, V, E]
        c, v, e = table.shape
        b = x.shape[1]
        idx = x.long() + torch.arange(c, device=x.device).mul_(v).view(c, 1, 1)
        seq = F.embedding(idx, table.reshape(c * v, e))  # [C, B, T, E]
        weights: list[Sequence[torch.Tensor]] = []
        for layer in range(self.layers):
            for n in (f"lstm.weight_ih_l{layer}", f"lstm.weight_hh_l{layer}"):
                weights.append(params[n].unbind(0))  # unbind: its backward is one stack
            if self.init == "tf":  # one bias: torch.lstm's second is zero
                bias = params[f"lstm.bias_l{layer}"]
                weights += [bias.unbind(0), [bias.new_zeros(bias.shape[1])] * c]
            else:
                weights += [params[f"lstm.bias_{k}_l{layer}"].unbind(0) for k in ("ih", "hh")]
        zeros = seq.new_zeros(self.layers, b, self.hidden)
        train = torch.is_grad_enabled()
        outs = [
            torch.lstm(
                seq_c,
                (zeros, zeros),
                [w[ci] for w in weights],
                True,
                self.layers,
                0.0,
                train,
                False,
                True,
            )[0][:, -1]
            for ci, seq_c in enumerate(seq.unbind(0))
        ]
        return torch.stack(outs)

    def _features_bmm(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """:meth:`_features` batched over clients (one ``baddbmm`` per step, module docstring)."""
        table = params["embedding.weight"]  # [C, V, E]
        c, v, e = table.shape
        b, t_len = x.shape[1], x.shape[2]
        idx = x.long().transpose(1, 2)  # [C, T, B]: time steps, then samples, per client
        idx = idx + torch.arange(c, device=idx.device).mul_(v).view(c, 1, 1)
        seq = F.embedding(idx.reshape(c, t_len * b), table.reshape(c * v, e))  # [C, T*B, E]
        for layer in range(self.layers):
            w_ih = params[f"lstm.weight_ih_l{layer}"]
            w_hh = params[f"lstm.weight_hh_l{layer}"]
            biases = [params[n] for n in self.bias_names(layer)]
            bias = biases[0] if len(biases) == 1 else biases[0] + biases[1]
            xproj = torch.baddbmm(bias.unsqueeze(1), seq, w_ih.transpose(1, 2))
            xproj = xproj.view(c, t_len, b, -1)
            if torch.is_grad_enabled() and (xproj.requires_grad or w_hh.requires_grad):
                out = _Recurrence.apply(xproj, w_hh)
            else:
                out = _run(xproj, w_hh, keep=False)[0]
            if layer == self.layers - 1:
                return out[:, -1]
            seq = out.reshape(c, t_len * b, -1)
        raise AssertionError("unreachable: an LSTM has at least one layer")

    # ------------------------------------------------------------------ FLOPs
    def flops_per_sample(self) -> int:
        """Forward FLOPs per sample, as the kernels compute them (module docstring)."""
        t, h = self.seq_len, self.hidden
        total = 0
        for layer in range(self.layers):
            inp = self.embed_dim if layer == 0 else h
            total += t * 8 * h * inp + (t - 1) * 8 * h * h
        return total + 2 * h * self.num_classes

    def train_flops_per_sample(self) -> int:
        """Training FLOPs per sample: forward, weight gradients and input gradients (the
        embedding is trained, so even the first layer's input gradient is computed): 3×."""
        return 3 * self.flops_per_sample()

    # ------------------------------------------------------------------ unit masks
    def unit_groups(self) -> tuple[UnitGroup, ...]:
        """One group per LSTM layer over its hidden units (:mod:`fedhp.models.masks`): unit j's
        four gate rows of ``weight_ih`` and ``weight_hh`` (and, structurally, of both biases),
        and its output's columns in the same layer's ``weight_hh`` and in the next layer's input
        weights (``weight_ih`` of the next layer, or ``fc.weight`` after the last)."""
        out = []
        for layer in range(self.layers):
            nxt = f"lstm.weight_ih_l{layer + 1}" if layer + 1 < self.layers else "fc.weight"
            out.append(
                UnitGroup(
                    name=f"lstm.l{layer}",
                    size=self.hidden,
                    weight=f"lstm.weight_ih_l{layer}",
                    extras=self.bias_names(layer),
                    gates=4,
                    row_weights=(f"lstm.weight_hh_l{layer}",),
                    inputs=(f"lstm.weight_hh_l{layer}", nxt),
                )
            )
        return tuple(out)

    def live_layers(self, pmask: torch.Tensor) -> list[list[tuple[str, int, torch.Tensor, int]]]:
        """For :func:`fedhp.models.masks.sparse_flops` / ``held_entries``: per client, per matrix
        product (each layer's ``weight_ih`` and ``weight_hh``, then ``fc.weight``): its name, its
        non-zero mask entries reading live inputs, the live inputs and the products per sample.

        A hidden unit is live when any of its gate rows (weights or biases) is kept; embedding
        dimensions are always live."""
        specs = {s.name: s for s in self.layout.specs}
        h, t = self.hidden, self.seq_len
        out = []
        for row in pmask:
            layers: list[tuple[str, int, torch.Tensor, int]] = []
            live_in = torch.ones(self.embed_dim, dtype=torch.bool, device=pmask.device)
            for layer in range(self.layers):
                names = [
                    f"lstm.weight_ih_l{layer}",
                    f"lstm.weight_hh_l{layer}",
                    *self.bias_names(layer),
                ]
                views = [self.layout.view(row, specs[n]).reshape(4, h, -1) for n in names]
                live = torch.stack([(v != 0).transpose(0, 1).flatten(1).any(1) for v in views]).any(
                    0
                )
                w_ih, w_hh = views[0].reshape(4 * h, -1), views[1].reshape(4 * h, -1)
                layers.append((names[0], int((w_ih[:, live_in] != 0).sum()), live_in, t))
                layers.append((names[1], int((w_hh[:, live] != 0).sum()), live, t - 1))
                live_in = live
            fc = self.layout.view(row, specs["fc.weight"])
            layers.append(("fc.weight", int((fc[:, live_in] != 0).sum()), live_in, 1))
            out.append(layers)
        return out


@MODELS.register("lstm")
class LSTMOptions(ModelOptions):
    """LEAF's Shakespeare model: embedding (8) → 2-layer LSTM (256) → linear to the vocabulary,
    predicting the next character from the last time step. Inputs: character indices
    ``[seq_len]`` (the vocabulary is the dataset's number of classes)."""

    embed_dim: pydantic.PositiveInt = 8
    hidden: pydantic.PositiveInt = 256
    layers: pydantic.PositiveInt = 2
    init: Literal["torch", "tf"] = pydantic.Field(
        "torch",
        description="torch: nn.LSTM's two biases per gate block and PyTorch's init; tf: FedProx's "
        "TensorFlow model (one bias, forget-gate bias 1.0, Glorot-uniform weights)",
    )

    def build(self, feature_shape: tuple[int, ...], num_classes: int) -> BatchedModel:
        if len(feature_shape) != 1:
            raise ConfigError(
                f"model.name: 'lstm' needs sequences of character indices [seq_len], got "
                f"features {feature_shape}; use dataset.name=shakespeare"
            )
        module = CharLSTM(num_classes, self.embed_dim, self.hidden, self.layers, self.init)
        return BatchedLSTM(module, feature_shape, num_classes)
