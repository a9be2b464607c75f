"""Unit masks: groups, parameter masks, masked training vs a zeroed per-client reference, FLOPs of
masked models vs physically pruned modules, and the masks' wire size."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedhp.engine.ops import LocalWork
from fedhp.models.base import BatchedModel
from fedhp.models.masks import UnitGroup, masked_flops, num_units, param_mask, unit_groups
from fedhp.models.vmap import VmapModel
from fedhp.models.zoo import VGG, CNNOptions, DNNOptions, VGGOptions
from tests.engine.test_local_epochs import SHAPE, unequal_context

CLASSES = 3


def _flops(module: nn.Module, shape: tuple[int, ...]) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module(torch.zeros(1, *shape))
    return int(counter.get_total_flops())


def _random_unit_mask(model: BatchedModel, clients: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(clients, num_units(model), generator=g) < 0.6
    mask[:, 0] = True  # keep at least one unit per client
    return mask


def test_groups_of_mlp_cnn_vgg_leave_the_output_layer_out() -> None:
    dnn = DNNOptions(hidden=[7, 5]).build(SHAPE, CLASSES)
    assert unit_groups(dnn) == (
        UnitGroup("layers.0", 7, "layers.0.weight", ("layers.0.bias",)),
        UnitGroup("layers.1", 5, "layers.1.weight", ("layers.1.bias",)),
    )
    cnn = CNNOptions().build(SHAPE, CLASSES)
    assert [(g.name, g.size) for g in unit_groups(cnn)] == [
        ("conv1", 32),
        ("conv2", 64),
        ("fc1", 512),
    ]
    vgg = VGGOptions(cfg=[4, "M", 6]).build(SHAPE, CLASSES)
    assert [(g.name, g.size) for g in unit_groups(vgg)] == [("features.0", 4), ("features.3", 6)]


def test_a_batch_norm_after_a_layer_joins_its_group_and_a_model_may_override() -> None:
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 3)
    )
    model = VmapModel(net, SHAPE, CLASSES)
    assert unit_groups(model) == (UnitGroup("0", 4, "0.weight", ("0.bias", "1.weight", "1.bias")),)
    pm = param_mask(model, torch.tensor([[True, False, True, True]]))
    views = model.layout.unflatten(pm)
    assert views["1.weight"][0].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert views["1.bias"][0].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert float(views["0.weight"][0, 1].abs().sum()) == 0.0
    assert bool((views["4.weight"] == 1).all())  # the output layer is never masked

    pruned = nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 36, 3)
    )
    assert int(masked_flops(model, torch.tensor([[True, False, True, True]]))[0]) == _flops(
        pruned.eval(), SHAPE
    )

    custom = (UnitGroup("0", 4, "0.weight"),)
    model.unit_groups = lambda: custom  # type: ignore[attr-defined]
    assert unit_groups(model) == custom


@pytest.mark.parametrize("structural", [True, False])
def test_param_mask_zeroes_rows_and_optionally_biases(structural: bool) -> None:
    model = DNNOptions(hidden=[4]).build(SHAPE, CLASSES)
    pm = param_mask(model, torch.tensor([[1, 0, 1, 0]]), structural=structural)
    v = model.layout.unflatten(pm)
    assert v["layers.0.weight"][0].sum(1).tolist() == [64.0, 0.0, 64.0, 0.0]
    assert v["layers.0.bias"][0].tolist() == ([1.0, 0.0, 1.0, 0.0] if structural else [1.0] * 4)
    assert bool((v["layers.1.weight"] == 1).all()) and bool((v["layers.1.bias"] == 1).all())
    with pytest.raises(ValueError, match="unit_mask must be"):
        param_mask(model, torch.ones(1, 5))


def _reference_masked_sgd(
    model: BatchedModel,
    start: torch.Tensor,
    mask: torch.Tensor,
    batches: list[list[tuple[torch.Tensor, torch.Tensor]]],
    lr: float,
) -> torch.Tensor:
    """A zeroed plain module per client: masked weights zero, their gradients zeroed."""
    out = []
    for c in range(start.shape[0]):
        module = model.make_module(start[c] * mask[c])
        masks = [model.layout.view(mask[c], s) for s in model.layout.specs]
        opt = torch.optim.SGD(module.parameters(), lr=lr)
        for x, y in batches[c]:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(module(x), y).backward()
            for p, m in zip(module.parameters(), masks, strict=True):
                p.grad.mul_(m)  # type: ignore[union-attr]
            opt.step()
        out.append(model.layout.flatten_module(module))
    return torch.stack(out)


BUILDERS = {
    "dnn": lambda: DNNOptions(hidden=[16, 8]).build(SHAPE, CLASSES),
    "cnn": lambda: CNNOptions().build(SHAPE, CLASSES),
    "vgg": lambda: VGGOptions(cfg=[4, "M", 6, "M"]).build(SHAPE, CLASSES),
}


@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize("structural", [True, False])
def test_masked_steps_match_a_zeroed_reference(kind: str, structural: bool) -> None:
    model = BUILDERS[kind]()
    ctx = unequal_context(model)
    clients = ctx.all_clients
    mask = param_mask(model, _random_unit_mask(model, len(clients)), structural)
    start = torch.stack([model.init_params(s) for s in range(len(clients))])
    state = ctx.generator.get_state()
    params, _ = ctx.local_sgd(start, clients, LocalWork(0.1, 4, 3), mask=mask)[:2]
    ctx.generator.set_state(state)
    drawn = [ctx.batches(clients, 4)() for _ in range(3)]
    batches = [[(x[c], y[c]) for x, y in drawn] for c in range(len(clients))]
    reference = _reference_masked_sgd(model, start, mask, batches, 0.1)
    assert (params - reference).abs().max().item() < 1e-5
    assert bool((params[mask == 0] == 0).all())  # masked entries stay exactly zero
    assert (params - start * mask).abs().max().item() > 1e-3


def test_masked_local_epochs_keep_masked_entries_zero() -> None:
    model = DNNOptions(hidden=[16]).build(SHAPE, CLASSES)
    ctx = unequal_context(model)
    clients = ctx.all_clients
    mask = param_mask(model, _random_unit_mask(model, len(clients), seed=1))
    start = torch.stack([model.init_params(s) for s in range(len(clients))])
    state = ctx.generator.get_state()
    params, _, steps = ctx.local_sgd(start, clients, LocalWork(0.1, 6, epochs=2), mask=mask)
    ctx.generator.set_state(state)
    plan = ctx.sampler.epochs(clients, 6, 2)
    lo = ctx.fed.train.offsets
    batches = []
    for c in range(len(clients)):
        xc, yc = ctx.fed.train.x[lo[c] : lo[c + 1]], ctx.fed.train.y[lo[c] : lo[c + 1]]
        keep = [plan.index[s, c][plan.weight[s, c] > 0] for s in range(plan.num_steps)]
        batches.append([(xc[k], yc[k]) for k in keep if len(k)])
    reference = _reference_masked_sgd(model, start, mask, batches, 0.1)
    assert (params - reference).abs().max().item() < 1e-5
    assert bool((params[mask == 0] == 0).all())


class _PrunedCNN(nn.Module):
    """MnistCNN with only the kept channels / units (physically smaller)."""

    def __init__(self, a: int, b: int, c: int, side: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, a, 5, padding=2)
        self.conv2 = nn.Conv2d(a, b, 5, padding=2)
        self.fc1 = nn.Linear(b * (side // 4) ** 2, c)
        self.fc2 = nn.Linear(c, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = torch.max_pool2d(torch.relu(self.conv2(h)), 2)
        return self.fc2(torch.relu(self.fc1(h.flatten(-3))))


def test_masked_flops_equal_the_flop_counter_on_physically_pruned_modules() -> None:
    cnn = CNNOptions().build(SHAPE, CLASSES)
    units = _random_unit_mask(cnn, 3, seed=2)
    units[2] = True  # the full model
    flops = masked_flops(cnn, units)
    for c in range(3):
        a, b, k = (int(units[c, s].sum()) for s in (slice(0, 32), slice(32, 96), slice(96, 608)))
        assert int(flops[c]) == _flops(_PrunedCNN(a, b, k, 8), SHAPE)
    assert int(flops[2]) == cnn.flops_per_sample()

    vgg = VGGOptions(cfg=[5, "M", 7, 3]).build(SHAPE, CLASSES)
    units = _random_unit_mask(vgg, 3, seed=4)
    for c, f in enumerate(masked_flops(vgg, units).tolist()):
        widths = [int(units[c, :5].sum()), int(units[c, 5:12].sum()), int(units[c, 12:].sum())]
        pruned = VGG([widths[0], "M", widths[1], widths[2]], 1, 8, CLASSES)
        assert f == _flops(pruned, SHAPE)

    dnn = DNNOptions(hidden=[10, 6]).build(SHAPE, CLASSES)
    units = _random_unit_mask(dnn, 2, seed=3)
    for c, f in enumerate(masked_flops(dnn, units).tolist()):
        h1, h2 = int(units[c, :10].sum()), int(units[c, 10:].sum())
        pruned = nn.Sequential(
            nn.Flatten(), nn.Linear(64, h1), nn.ReLU(), nn.Linear(h1, h2), nn.Linear(h2, 3)
        )
        assert f == _flops(pruned, SHAPE)


def test_fedlps_cnn_at_half_width_by_hand() -> None:
    """The paper's MNIST CNN (conv 1→10, 10→20, 5×5, no padding; FC 320→50→10) at s = 0.5: keep
    5 of 10, 10 of 20 and 25 of 50 units. Full model: conv1 10·24²·25·2 = 288,000, conv2
    20·8²·250·2 = 640,000, fc1 50·320·2 = 32,000, fc2 10·50·2 = 1,000 → 961,000 per sample.
    Pruned (structural): conv1 5·576·25·2 = 144,000; conv2 10·64·(5·25)·2 = 160,000 (5 live
    inputs); fc1 25·(10·16)·2 = 8,000; fc2 10·25·2 = 500 → 312,500. Row-only masks (the code's)
    leave dropped units' biases alive, so every next layer reads all its inputs: 144,000 +
    320,000 + 16,000 + 1,000 = 481,000. Training = 3 × forward."""
    from fedhp.models.masks import unit_mask_from_scores
    from fedhp.models.zoo import CNN2Options

    cnn = CNN2Options().build((1, 28, 28), 10)
    assert [g.size for g in unit_groups(cnn)] == [10, 20, 50]
    scores = torch.rand(1, num_units(cnn), generator=torch.Generator().manual_seed(0))
    units = unit_mask_from_scores(cnn, scores, torch.tensor([0.5]))
    assert [int(b.sum()) for b in units[0].split([10, 20, 50])] == [5, 10, 25]
    assert cnn.flops_per_sample() == 961_000
    assert int(masked_flops(cnn, units)[0]) == 312_500
    assert int(masked_flops(cnn, units, structural=False)[0]) == 481_000
    assert 3 * int(masked_flops(cnn, units)[0]) == 937_500


def test_row_only_masks_keep_the_next_layers_inputs_alive() -> None:
    """Without ``structural``, a dropped unit still outputs its bias: only its own row is saved."""
    dnn = DNNOptions(hidden=[10]).build(SHAPE, CLASSES)
    units = torch.zeros(1, 10, dtype=torch.bool)
    units[0, :4] = True
    assert int(masked_flops(dnn, units, structural=False)[0]) == 2 * 4 * 64 + 2 * 3 * 10
    assert int(masked_flops(dnn, units)[0]) == 2 * 4 * 64 + 2 * 3 * 4


def test_masks_from_scores_keep_the_top_units_per_layer() -> None:
    """FedLPS: per layer, max(1, round(s·J)) units (half up) with the highest scores; ties to
    the lower index; the output layer is not a unit group."""
    from fedhp.models.masks import unit_mask_from_scores

    dnn = DNNOptions(hidden=[7, 5]).build(SHAPE, CLASSES)
    scores = torch.tensor(
        [
            [0.1, 0.9, 0.5, 0.5, 0.3, 0.8, 0.0, 5.0, 4.0, 3.0, 2.0, 1.0],
            [0.0] * 12,
        ]
    )
    mask = unit_mask_from_scores(dnn, scores, torch.tensor([0.5, 0.01]))
    assert mask.shape == (2, 12)
    # client 0, s = 0.5: round(3.5) = 4 of 7 -> 0.9, 0.8, 0.5 (idx 2), 0.5 (idx 3); 3 of 5
    assert (
        mask[0].tolist() == [False, True, True, True, False, True, False] + [True] * 3 + [False] * 2
    )
    # client 1, tiny s: one unit per layer, all scores tied -> the first
    assert mask[1].tolist() == [True] + [False] * 6 + [True] + [False] * 4
    full = unit_mask_from_scores(dnn, scores, torch.tensor([1.0, 1.0]))
    assert bool(full.all())


def test_unit_weight_norms_and_the_mask_gradient_match_autograd() -> None:
    from fedhp.models.masks import unit_mask_grad, unit_weight_norms

    dnn = DNNOptions(hidden=[7, 5]).build(SHAPE, CLASSES)
    params = torch.stack([dnn.init_params(s) for s in (0, 1)])
    views = dnn.layout.unflatten(params)
    norms = unit_weight_norms(dnn, params)
    expected = torch.cat(
        [views["layers.0.weight"].abs().sum(-1), views["layers.1.weight"].abs().sum(-1)], dim=1
    )
    torch.testing.assert_close(norms, expected)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, *SHAPE, generator=g)
    y = torch.randint(0, CLASSES, (2, 6), generator=g)
    m = (torch.rand(2, 12, generator=g) < 0.7).float()
    pm = param_mask(dnn, m)
    for structural in (True, False):
        mv = m.clone().requires_grad_(True)
        parts = []
        for spec in dnn.layout.specs:  # a differentiable parameter mask, spec by spec
            rows = {"layers.0": mv[:, :7], "layers.1": mv[:, 7:]}
            group = spec.name.rsplit(".", 1)[0]
            masked = group in rows and (structural or spec.name.endswith("weight"))
            if masked:
                t = rows[group].reshape(2, -1, *([1] * (len(spec.shape) - 1)))
                parts.append(t.expand(2, *spec.shape).reshape(2, -1))
            else:
                parts.append(torch.ones(2, spec.numel))
        dpm = torch.cat(parts, dim=1)
        if structural:
            torch.testing.assert_close(dpm.detach(), pm)  # the same mask as param_mask's
        logits = dnn.forward(params * dpm, x)  # the loss, differentiated through the mask
        ce = F.cross_entropy(logits.reshape(-1, CLASSES), y.reshape(-1), reduction="none")
        (auto,) = torch.autograd.grad(ce.view(2, 6).mean(1).sum(), mv)
        pm_s = param_mask(dnn, m, structural)
        _, grad_s = dnn.loss_and_grad(params * pm_s, x, y)
        torch.testing.assert_close(
            unit_mask_grad(dnn, params, grad_s, structural), auto, atol=1e-5, rtol=1e-4
        )


def test_window_unit_masks_are_ordered_or_rolling() -> None:
    from fedhp.models.masks import window_unit_mask

    dnn = DNNOptions(hidden=[7, 5]).build(SHAPE, CLASSES)
    ordered = window_unit_mask(dnn, torch.tensor([0.5, 1 / 16]))
    assert ordered[0].tolist() == [1, 1, 1, 1, 0, 0, 0] + [1, 1, 1, 0, 0]  # round(3.5), round(2.5)
    assert ordered[1].tolist() == [1, 0, 0, 0, 0, 0, 0] + [1, 0, 0, 0, 0]  # at least one
    rolled = window_unit_mask(dnn, torch.tensor([0.5]), 6)
    assert rolled[0].tolist() == [1, 1, 1, 0, 0, 0, 1] + [0, 1, 1, 1, 0]  # (6 + i) mod J


def test_held_entries_drop_the_inputs_of_dropped_units_by_hand() -> None:
    from fedhp.models.masks import held_entries

    dnn = DNNOptions(hidden=[7, 5]).build(SHAPE, CLASSES)
    units = torch.zeros(1, 12, dtype=torch.bool)
    units[0, [0, 1]] = True  # layer 0 keeps units 0, 1
    units[0, 7] = True  # layer 1 keeps unit 0
    views = dnn.layout.unflatten(held_entries(dnn, param_mask(dnn, units)))
    w1 = torch.zeros(5, 7)
    w1[0, :2] = 1
    w2 = torch.zeros(CLASSES, 5)
    w2[:, 0] = 1
    assert bool((views["layers.1.weight"][0] == w1).all())
    assert bool((views["layers.2.weight"][0] == w2).all())
    assert views["layers.2.bias"][0].tolist() == [1.0] * CLASSES
    assert float(views["layers.0.weight"][0, :2].min()) == 1.0  # every input pixel is live
    assert float(views["layers.0.weight"][0, 2:].max()) == 0.0


def test_sparse_flops_count_the_non_zero_weights_by_hand() -> None:
    from fedhp.models.masks import sparse_flops

    dnn = DNNOptions(hidden=[6]).build(SHAPE, CLASSES)
    pm = (torch.rand(2, dnn.num_params, generator=torch.Generator().manual_seed(3)) < 0.5).float()
    views = dnn.layout.unflatten(pm)
    for c in range(2):
        w0, b0, w1 = (views[f"layers.{n}"][c] for n in ("0.weight", "0.bias", "1.weight"))
        live = (w0.sum(1) > 0) | (b0 > 0)  # hidden units with a non-zero output
        expected = 2 * int(w0.sum()) + 2 * int(w1[:, live].sum())
        assert int(sparse_flops(dnn, pm)[c]) == expected
    # for a unit mask it is masked_flops
    units = _random_unit_mask(dnn, 3)
    assert sparse_flops(dnn, param_mask(dnn, units)).tolist() == masked_flops(dnn, units).tolist()
