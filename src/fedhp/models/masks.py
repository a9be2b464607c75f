"""Unit masks: per-client masks over whole units (MLP neurons, conv output channels).

A *unit group* is one layer's units: the rows (dim 0) of its weight, plus the entries of its bias
and of a BatchNorm right after it that belong to the same units. A unit mask ``[C, U]`` (U = the
units of all groups, concatenated in group order; 1 = kept) becomes a parameter mask ``[C, P]``
with :func:`param_mask`; masked training multiplies the parameters and their gradients by it
outside the model's forward (:func:`fedhp.engine.ops.weighted_sgd_steps`' ``mask``), so every
model works unchanged. :func:`masked_flops` counts what a physically pruned model computes, and
:func:`fedhp.comm.unit_mask_bytes` is the mask's wire size (a bitmap over units).

Groups are derived from the reference ``nn.Module``: every ``nn.Linear`` / ``nn.Conv2d`` except
the last one (the output layer, never masked) is a group over its output units; a BatchNorm that
directly follows it (next module with parameters, same number of features) joins the group. A
model can override this by defining ``unit_groups() -> tuple[UnitGroup, ...]`` (e.g. for
residual blocks).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedhp.errors import ConfigError
from fedhp.models.base import BatchedModel

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d)


@dataclass(frozen=True)
class UnitGroup:
    """One layer's maskable units.

    ``weight``: the parameter whose rows are the units; ``extras``: the unit-indexed vectors
    (bias, the following BatchNorm's weight and bias) zeroed with them in ``structural`` masks.

    Recurrent layers (an LSTM's hidden units, :mod:`fedhp.models.lstm`) also use: ``gates``: the
    unit-indexed tensors hold that many blocks of ``size`` rows (an LSTM's i, f, g, o), unit j
    being row j of every block; ``row_weights``: further weights whose rows are the units (the
    recurrent ``weight_hh``), masked and scored like ``weight``; ``inputs``: weights whose
    columns (dim 1) read the units' outputs (the same layer's ``weight_hh``, the next layer's
    input weights), zeroed for a dropped unit in every mask.
    """

    name: str
    size: int
    weight: str
    extras: tuple[str, ...] = ()
    gates: int = 1
    row_weights: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()

    def rows(self, structural: bool) -> tuple[str, ...]:
        """The tensors whose rows are the units: the weights, and with ``structural`` the
        extras."""
        weights = (self.weight, *self.row_weights)
        return (*weights, *self.extras) if structural else weights


def unit_groups(model: BatchedModel) -> tuple[UnitGroup, ...]:
    """The model's unit groups (``model.unit_groups()`` if it defines one, else derived from its
    reference module as described in the module docstring)."""
    custom = getattr(model, "unit_groups", None)
    if callable(custom):
        groups: tuple[UnitGroup, ...] = tuple(custom())
        return groups
    leaves = [
        (name, m)
        for name, m in model.reference.named_modules()
        if any(True for _ in m.parameters(recurse=False))
    ]
    layers = [i for i, (_, m) in enumerate(leaves) if isinstance(m, nn.Linear | nn.Conv2d)]
    out: list[UnitGroup] = []
    for i in layers[:-1]:
        name, m = leaves[i]
        size = int(m.weight.shape[0])
        prefix = f"{name}." if name else ""
        extras = [f"{prefix}bias"] if getattr(m, "bias", None) is not None else []
        if i + 1 < len(leaves):
            bn_name, bn = leaves[i + 1]
            if isinstance(bn, _BATCH_NORMS) and bn.num_features == size and bn.affine:
                extras += [f"{bn_name}.weight", f"{bn_name}.bias"]
        out.append(UnitGroup(name, size, f"{prefix}weight", tuple(extras)))
    return tuple(out)


def num_units(model: BatchedModel) -> int:
    """U: the maskable units of all groups."""
    return sum(g.size for g in unit_groups(model))


def require_hidden_units(model: BatchedModel, method: str, what: str) -> None:
    """A one-line :class:`ConfigError` where ``model`` has no hidden units, i.e. it is its
    output layer alone (``mlr``, ``linreg``, ...), for a ``method`` that ``what`` (e.g.
    "shrinks hidden widths")."""
    if num_units(model) == 0:
        raise ConfigError(
            f"model: {method} {what}, and this model has none (it is one output layer); use a "
            "model with hidden layers, e.g. model.name=dnn or cnn"
        )


def param_mask(
    model: BatchedModel, unit_mask: torch.Tensor, structural: bool = True
) -> torch.Tensor:
    """The parameter mask ``[C, P]`` (float 0/1) of a unit mask ``[C, U]`` (bool or 0/1).

    A dropped unit's weight row is zeroed; with ``structural`` (default) also its bias and the
    following BatchNorm's weight and bias, so its output is exactly zero (a pruned unit). With
    ``structural=False`` only the weight rows (the FedLPS authors' code)."""
    groups = unit_groups(model)
    if unit_mask.dim() != 2 or unit_mask.shape[1] != sum(g.size for g in groups):
        raise ValueError(
            f"unit_mask must be [C, {sum(g.size for g in groups)}], got {tuple(unit_mask.shape)}"
        )
    specs = {s.name: s for s in model.layout.specs}
    c = unit_mask.shape[0]
    out = torch.ones(c, model.num_params, device=unit_mask.device)
    start = 0
    for g in groups:
        m = unit_mask[:, start : start + g.size].to(out.dtype)
        start += g.size
        for name in g.rows(structural):
            view = model.layout.view(out, specs[name])
            if g.gates != 1:  # [C, gates * J, ..] as [C, gates, J, -1]
                view = view.reshape(c, g.gates, g.size, -1)
                view.mul_(m.reshape(c, 1, g.size, 1))  # (another group's columns stay zero)
                continue
            view.copy_(m.reshape(c, g.size, *([1] * (view.dim() - 2))).expand_as(view))
        for name in g.inputs:  # the columns reading the units' outputs
            view = model.layout.view(out, specs[name])
            view.mul_(m.reshape(c, 1, g.size, *([1] * (view.dim() - 3))))
    return out


def masked_flops(
    model: BatchedModel, unit_mask: torch.Tensor, structural: bool = True
) -> torch.Tensor:
    """Forward FLOPs per sample ``[C]`` (int64) of each client's masked model, counting only
    what a physically pruned model computes (PyTorch's FlopCounterMode convention: 2 per
    multiply-add of a Linear / Conv2d, nothing for biases, activations, pooling, BatchNorm):
    :func:`sparse_flops` of the unit mask's parameter mask."""
    return sparse_flops(model, param_mask(model, unit_mask, structural))


def sparse_flops(model: BatchedModel, pmask: torch.Tensor) -> torch.Tensor:
    """Forward FLOPs per sample ``[C]`` (int64) of the models whose non-zero weights are those of
    ``pmask [C, P]`` (unit-structured or unstructured): per Linear / Conv2d, 2 × the non-zero
    weight entries that read a live input × output positions (for a unit mask: kept units × live
    inputs × kernel area × positions). Inputs that no path reaches are found by
    :func:`_live_inputs`."""
    flops = []
    for layers in _layers(model, pmask):
        flops.append(sum(2 * int(nnz) * positions for _, nnz, _, positions in layers))
    return torch.tensor(flops, dtype=torch.int64)


def held_entries(model: BatchedModel, pmask: torch.Tensor) -> torch.Tensor:
    """The entries ``[C, P]`` (float 0/1) each client's sub-model really holds: ``pmask`` with the
    weight columns of dead inputs (outputs of dropped units, structurally zero) also zeroed — the
    entries HeteroFL-style aggregation averages over the clients holding them."""
    out = pmask.clone().float()
    specs = {s.name: s for s in model.layout.specs}
    for c, layers in enumerate(_layers(model, pmask)):
        for weight, _, live, _ in layers:
            view = model.layout.view(out[c : c + 1], specs[weight])[0]
            shape = (1, -1, *([1] * (view.dim() - 2)))
            view.mul_(live.to(view.dtype).reshape(shape))
    return out


def _layers(
    model: BatchedModel, pmask: torch.Tensor
) -> list[list[tuple[str, int, torch.Tensor, int]]]:
    """:func:`_live_inputs`, or the model's own ``live_layers(pmask)`` where it defines one (the
    LSTM, whose recurrence no Linear / Conv2d hook sees)."""
    custom = getattr(model, "live_layers", None)
    if callable(custom):
        layers: list[list[tuple[str, int, torch.Tensor, int]]] = custom(pmask)
        return layers
    return _live_inputs(model, pmask)


def _live_inputs(
    model: BatchedModel, pmask: torch.Tensor
) -> list[list[tuple[str, int, torch.Tensor, int]]]:
    """For each row of ``pmask [C, P]``, per Linear / Conv2d of the reference module: its weight's
    name, its non-zero mask entries reading live inputs, the live inputs (bool, one per input
    feature or channel) and its output positions per sample.

    A probe forward of the reference module with the mask itself as (non-negative) parameters
    (weights scaled to average their inputs, float64), unit BatchNorm statistics and an all-ones
    input: an activation is zero exactly when every path to it is pruned."""
    scaled = pmask.double().clone()
    for spec in model.layout.specs:  # weights averaging their inputs keep activations bounded
        if len(spec.shape) >= 2:
            model.layout.view(scaled, spec).div_(spec.numel // spec.shape[0])
    probe = copy.deepcopy(model.reference).double().eval()
    for m in probe.modules():
        if isinstance(m, _BATCH_NORMS) and m.running_mean is not None:
            m.running_mean.zero_()
            assert m.running_var is not None
            m.running_var.fill_(1.0)
    names = {id(m): f"{n}.weight" if n else "weight" for n, m in probe.named_modules()}
    layers: list[tuple[str, int, torch.Tensor, int]] = []

    def hook(m: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x = inputs[0]
        w = m.weight
        assert isinstance(w, torch.Tensor)
        if isinstance(m, nn.Conv2d):
            if m.groups != 1:
                raise ValueError("masked_flops: grouped convolutions are not supported")
            live = (x[0] != 0).flatten(1).any(1)
            nnz = int((w[:, live] != 0).sum())
            layers.append((names[id(m)], nnz, live, int(output.shape[-1] * output.shape[-2])))
        else:
            live = (x[0] != 0).reshape(-1, x.shape[-1]).any(0)
            nnz = int((w[:, live] != 0).sum())
            layers.append((names[id(m)], nnz, live, x[0].numel() // x.shape[-1]))

    handles = [
        m.register_forward_hook(hook)
        for m in probe.modules()
        if isinstance(m, nn.Linear | nn.Conv2d)
    ]
    ones = torch.ones(1, *model.feature_shape, dtype=torch.float64)
    out = []
    try:
        with torch.no_grad():
            for row in scaled:
                model.layout.load_into(probe, row)
                layers = []
                probe(ones)
                out.append(layers)
    finally:
        for h in handles:
            h.remove()
    return out


def _unit_rows(
    model: BatchedModel, flat: torch.Tensor, structural: bool
) -> list[list[torch.Tensor]]:
    """For each group, its unit-indexed tensors of ``flat [C, P]`` as ``[C, J, -1]`` tensors
    (views where ``gates`` is 1; each unit's gate rows gathered otherwise)."""
    specs = {s.name: s for s in model.layout.specs}
    c = flat.shape[0]
    out = []
    for g in unit_groups(model):
        views = [model.layout.view(flat, specs[n]) for n in g.rows(structural)]
        if g.gates == 1:
            out.append([v.reshape(c, g.size, -1) for v in views])
        else:
            out.append(
                [
                    v.reshape(c, g.gates, g.size, -1).transpose(1, 2).reshape(c, g.size, -1)
                    for v in views
                ]
            )
    return out


def _unit_columns(model: BatchedModel, flat: torch.Tensor) -> list[torch.Tensor | None]:
    """For each group, the sum over its ``inputs`` weights' columns of ``flat [C, P]`` per unit
    ``[C, J]`` (None for a group without ``inputs``)."""
    specs = {s.name: s for s in model.layout.specs}
    out: list[torch.Tensor | None] = []
    for g in unit_groups(model):
        sums = [
            model.layout.view(flat, specs[n]).transpose(1, 2).flatten(2).sum(-1) for n in g.inputs
        ]
        out.append(torch.stack(sums).sum(0) if sums else None)
    return out


def unit_weight_norms(model: BatchedModel, params: torch.Tensor) -> torch.Tensor:
    """|ω|_J ``[C, U]``: the sum of the absolute weights of every unit's weight row (FedLPS; an
    LSTM unit: its gate rows of ``weight_ih`` and ``weight_hh``)."""
    norms = []
    for rows in _unit_rows(model, params, False):
        total = rows[0].abs().sum(-1)
        for more in rows[1:]:
            total = total + more.abs().sum(-1)
        norms.append(total)
    return torch.cat(norms, dim=1)


def unit_mask_grad(
    model: BatchedModel, params: torch.Tensor, grad: torch.Tensor, structural: bool = True
) -> torch.Tensor:
    """∂L/∂m ``[C, U]`` of a loss L(ω ⊙ m) from ``grad [C, P]``, the gradient at the masked
    parameters: Σ ω·g over each unit's masked entries (the straight-through estimator's signal
    for unit scores)."""
    prod = params * grad
    parts = [sum(t.sum(-1) for t in rows) for rows in _unit_rows(model, prod, structural)]
    columns = _unit_columns(model, prod)  # a recurrent unit's mask also covers these columns
    parts = [p if col is None else p + col for p, col in zip(parts, columns, strict=True)]
    return torch.cat([p for p in parts if isinstance(p, torch.Tensor)], dim=1)


def unit_mask_from_scores(
    model: BatchedModel, scores: torch.Tensor, ratio: torch.Tensor
) -> torch.Tensor:
    """Bool ``[C, U]``: in every layer, the max(1, round(s·J)) units with the highest ``scores``
    (round half up; ties → the lower unit index) for each client's keep ratio ``ratio [C]``."""
    c = scores.shape[0]
    out = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    start = 0
    for g in unit_groups(model):
        block = scores[:, start : start + g.size]
        keep = kept_units(g.size, ratio)
        order = torch.sort(block, dim=1, descending=True, stable=True).indices
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(g.size, device=scores.device).expand(c, -1))
        out[:, start : start + g.size] = rank < keep.to(scores.device).unsqueeze(1)
        start += g.size
    return out


def kept_units(size: int, ratio: torch.Tensor) -> torch.Tensor:
    """max(1, round(s·J)) (round half up) for a layer of J = ``size`` units, per ratio (int64)."""
    return torch.floor(ratio.double() * size + 0.5).clamp(min=1, max=size).long()


def window_unit_mask(
    model: BatchedModel, ratio: torch.Tensor, offset: torch.Tensor | int = 0
) -> torch.Tensor:
    """Bool ``[C, U]``: in every layer of J units, the max(1, round(s·J)) consecutive units from
    ``offset`` on, wrapping around (units (offset + i) mod J): offset 0 is HeteroFL's ordered
    sub-model, an offset that advances every round FedRolex's rolling one."""
    c = len(ratio)
    off = torch.as_tensor(offset, dtype=torch.int64).expand(c).unsqueeze(1)
    parts = []
    for g in unit_groups(model):
        pos = (torch.arange(g.size).unsqueeze(0) - off) % g.size
        parts.append(pos < kept_units(g.size, ratio).unsqueeze(1))
    return torch.cat(parts, dim=1)


def output_layer_mask(model: BatchedModel) -> torch.Tensor:
    """Bool ``[P]``: the parameters of the output layer (the last ``nn.Linear`` / ``nn.Conv2d`` of
    the reference module, weight and bias) — the "head" of FedPer-style methods, the layer unit
    masks never touch."""
    layers = [
        name for name, m in model.reference.named_modules() if isinstance(m, nn.Linear | nn.Conv2d)
    ]
    if not layers:
        raise ValueError("output_layer_mask: the model has no Linear or Conv2d layer")
    prefix = f"{layers[-1]}." if layers[-1] else ""
    out = torch.zeros(model.num_params, dtype=torch.bool)
    for spec in model.layout.specs:
        if spec.name.startswith(prefix) and spec.name[len(prefix) :] in ("weight", "bias"):
            model.layout.view(out.unsqueeze(0), spec).fill_(True)
    return out
