"""The character LSTM of LEAF's Shakespeare task (embedding → stacked LSTM → linear on the last
time step), in the batched ``[C, P]`` form.

Inputs are character indices ``x [C, B, T]`` (uint8, or any dtype holding whole numbers; the
model embeds ``x.long()``), labels the next character's index. Every client's parameters are a row
of the flat ``[C, P]`` tensor, laid out as the reference ``nn.Module``'s ``named_parameters()``
(``embedding.weight``, ``lstm.weight_ih_l0``, ``lstm.weight_hh_l0``, ``lstm.bias_ih_l0``,
``lstm.bias_hh_l0``, ... , ``fc.weight``, ``fc.bias``; PyTorch's gate order i, f, g, o).

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

from typing import TYPE_CHECKING, Any

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


class CharLSTM(FeatureNet):
    """The reference module: ``nn.Embedding`` → ``nn.LSTM(batch_first=True)`` → ``nn.Linear`` on
    the last time step's output (LEAF's and FedProx's Shakespeare model with the default sizes)."""

    def __init__(self, vocab: int, embed_dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, vocab)

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
        names = [
            f"lstm.{k}_l{layer}"
            for layer in range(self.layers)
            for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        ]
        weights = [params[n].unbind(0) for n in names]  # unbind: its backward is one stack
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
            bias = params[f"lstm.bias_ih_l{layer}"] + params[f"lstm.bias_hh_l{layer}"]
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
                    extras=(f"lstm.bias_ih_l{layer}", f"lstm.bias_hh_l{layer}"),
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
                    f"lstm.{k}_l{layer}" for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
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

    def build(self, feature_shape: tuple[int, ...], num_classes: int) -> BatchedModel:
        if len(feature_shape) != 1:
            raise ConfigError(
                f"model.name: 'lstm' needs sequences of character indices [seq_len], got "
                f"features {feature_shape}; use dataset.name=shakespeare"
            )
        module = CharLSTM(num_classes, self.embed_dim, self.hidden, self.layers)
        return BatchedLSTM(module, feature_shape, num_classes)
