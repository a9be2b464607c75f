"""pFedGP's per-client classifier: a binary tree over the client's classes with one binary GP
(:mod:`fedhp.algorithms.gp`) at every internal node (spec ``specs/pfedgp.md``).

The tree: a node with more than two classes is split in two by 2-means on the classes' mean
embeddings (unnormalized; exact by enumeration up to 16 classes, else the best of ``restarts``
seeded k-means++ runs); a two-class node has two leaves; a one-class client has no node (it
predicts its class). A class's probability is the product of the branch probabilities on its
path (left = σ(f)). Training uses the predictive objective: at each node the node's samples are
split 50/50 within each class, Gibbs runs on the first half and the second half's cross-entropy
is taken under the predictive (the tree's loss: the sum over nodes of their mean
cross-entropy). Prediction conditions every node on all of the client's training samples under
it (a full GP).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedhp.algorithms.gp import expected_sigmoid, gibbs, marginal_log_likelihood, predictive
from fedhp.data.categories import kmeans

Kernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Node:
    """An internal node: the classes of its left and right subtrees (client class ids)."""

    left: tuple[int, ...]
    right: tuple[int, ...]

    @property
    def classes(self) -> tuple[int, ...]:
        return self.left + self.right


@dataclass(frozen=True)
class GPSettings:
    """The node GPs' kernel, constant mean and Gibbs budget."""

    kernel: Kernel
    mean: float = 0.0
    gibbs_steps: int = 5
    chains: int = 20
    quadrature: int = 20
    code_predictive: bool = False
    objective: str = "predictive"  # or "marginal"


def build_tree(means: torch.Tensor, classes: list[int], restarts: int = 50) -> list[Node]:
    """The internal nodes (root first) for ``classes`` with mean embeddings ``means [C, d]``."""
    if len(classes) < 2:
        return []
    if len(classes) == 2:
        return [Node((classes[0],), (classes[1],))]
    left, right = _two_means(means, restarts)
    lc = [classes[i] for i in left]
    rc = [classes[i] for i in right]
    return [
        Node(tuple(lc), tuple(rc)),
        *build_tree(means[left], lc, restarts),
        *build_tree(means[right], rc, restarts),
    ]


def _two_means(means: torch.Tensor, restarts: int) -> tuple[list[int], list[int]]:
    """Row indices of the two clusters of 2-means: the exact optimum (least within-cluster sum of
    squares, by enumerating every split) up to :data:`EXACT_MAX` rows — what the authors' 50
    k-means restarts aim at — else the best of ``restarts`` seeded k-means++ runs. Both sides
    non-empty; row 0 is on the left."""
    x = means.detach().double().cpu()
    n = len(x)
    if n <= EXACT_MAX:
        codes = torch.arange(1, 2 ** (n - 1), dtype=torch.long)  # row 0 always on the left
        right = ((codes.unsqueeze(1) >> torch.arange(n - 1)) & 1).bool()
        right = torch.cat([torch.zeros(len(codes), 1, dtype=torch.bool), right], 1)
        sse = _split_sse(x, right)
        best = right[int(torch.argmin(sse))]  # ties: the lowest code
        return (~best).nonzero().flatten().tolist(), best.nonzero().flatten().tolist()
    found: tuple[float, list[int]] | None = None
    for seed in range(restarts):
        labels, centroids = kmeans(x, 2, seed)
        inertia = float(((x - centroids[torch.as_tensor(labels)]) ** 2).sum())
        if 0 < labels.sum() < n and (found is None or inertia < found[0] - 1e-12):
            found = (inertia, [int(v) for v in labels])
    assign = found[1] if found is not None else [0] * (n // 2) + [1] * (n - n // 2)
    left = [i for i, a in enumerate(assign) if a == assign[0]]
    right_rows = [i for i, a in enumerate(assign) if a != assign[0]]
    return left, right_rows


EXACT_MAX = 16
"""Up to this many classes a node is split by exact 2-means (2^(n-1) − 1 candidate splits)."""


def _split_sse(x: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Within-cluster sums of squares ``[S]`` of the splits ``right [S, n]`` (True: right)."""
    total = (x**2).sum()
    out = torch.full((len(right),), float(total), dtype=torch.float64)
    for side in (right, ~right):
        w = side.double()
        count = w.sum(1, keepdim=True).clamp(min=1)
        sums = w @ x
        out -= (sums**2).sum(1) / count[:, 0]
    return out


def client_tree(emb: torch.Tensor, y: torch.Tensor, restarts: int = 50) -> list[Node]:
    """The tree of one client from its training embeddings ``[n, d]`` and labels ``[n]``."""
    classes = sorted(int(c) for c in torch.unique(y))
    means = torch.stack([emb[y == c].mean(0) for c in classes]).detach()
    return build_tree(means, classes, restarts)


def _node_data(node: Node, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the samples under ``node`` and their binary labels (1 = left)."""
    classes = torch.tensor(node.classes, device=y.device)
    idx = torch.isin(y, classes).nonzero().flatten()
    left = torch.isin(y[idx], torch.tensor(node.left, device=y.device)).long()
    return idx, left


def _half_split(y: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of a random half of every class (the GP's data; at least one) and the rest."""
    fit, score = [], []
    for c in torch.unique(y):
        pos = (y == c).nonzero().flatten()
        pos = pos[torch.randperm(len(pos), generator=generator)]
        k = max(1, (len(pos) + 1) // 2)
        fit.append(pos[:k])
        score.append(pos[k:])
    return torch.cat(fit), torch.cat(score)


def _left_probability(
    emb_fit: torch.Tensor,
    labels: torch.Tensor,
    emb_new: torch.Tensor,
    gp: GPSettings,
    chains: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """p(left) ``[m]`` of new points under the node GP fitted on (``emb_fit``, ``labels``),
    averaged over chains (differentiable in the embeddings)."""
    k = gp.kernel(emb_fit, emb_fit)
    state = gibbs(k, labels, gp.mean, gp.gibbs_steps, chains, generator)
    cross = gp.kernel(emb_fit, emb_new)
    mu, var = predictive(k, cross, _diag(gp.kernel, emb_new), labels, state, gp.mean)
    return expected_sigmoid(mu, var, gp.quadrature, gp.code_predictive).mean(0)


def _diag(kernel: Kernel, x: torch.Tensor) -> torch.Tensor:
    """k(x_i, x_i) for every row, read off the diagonals of blocks of 256 rows."""
    blocks = [kernel(x[i : i + 256], x[i : i + 256]).diagonal() for i in range(0, len(x), 256)]
    return torch.cat(blocks)


def tree_loss(
    emb: torch.Tensor, y: torch.Tensor, tree: list[Node], gp: GPSettings, generator: torch.Generator
) -> torch.Tensor | None:
    """One client's objective, summed over nodes: the predictive one (the mean cross-entropy of
    each node's held-out half) or, with ``gp.objective == "marginal"``, minus the augmented
    marginal log-likelihood of the node's samples averaged over chains and divided by their
    number. None when no node has anything to score (e.g. one class)."""
    total: torch.Tensor | None = None
    for node in tree:
        idx, labels = _node_data(node, y)
        if gp.objective == "marginal":
            k = gp.kernel(emb[idx], emb[idx])
            state = gibbs(k, labels, gp.mean, gp.gibbs_steps, gp.chains, generator)
            nll = -marginal_log_likelihood(k, labels, state, gp.mean).mean() / len(idx)
            total = nll if total is None else total + nll
            continue
        fit, score = _half_split(y[idx], generator)
        if len(score) == 0:
            continue
        p_left = _left_probability(
            emb[idx[fit]], labels[fit], emb[idx[score]], gp, gp.chains, generator
        )
        loss = _cross_entropy(p_left, labels[score]).mean()
        total = loss if total is None else total + loss
    return total


def _cross_entropy(p_left: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """−log p(label) per sample for left-branch probabilities (label 1 = left)."""
    target = labels.to(p_left.dtype)
    return -torch.log((target * p_left + (1 - target) * (1 - p_left)).clamp(min=1e-12))


def inducing_tree_loss(
    emb: torch.Tensor,
    y: torch.Tensor,
    inducing: torch.Tensor,
    inducing_y: torch.Tensor,
    tree: list[Node],
    gp: GPSettings,
    generator: torch.Generator,
) -> torch.Tensor | None:
    """pFedGP-IP's (IP-data) objective: every node's GP is fitted on the inducing points
    ``inducing [m, d]`` (labels ``inducing_y``) of its classes and scores all of the client's
    samples under it, class-balanced (the mean over classes of each class's mean
    cross-entropy); summed over nodes. Differentiable in ``emb`` and ``inducing``."""
    total: torch.Tensor | None = None
    for node in tree:
        idx, labels = _node_data(node, y)
        fit, fit_labels = _node_data(node, inducing_y)
        if len(idx) == 0 or len(fit) == 0:
            continue
        p_left = _left_probability(inducing[fit], fit_labels, emb[idx], gp, gp.chains, generator)
        ce = _cross_entropy(p_left, labels)
        per_class = [ce[y[idx] == c].mean() for c in node.classes if bool((y[idx] == c).any())]
        loss = torch.stack(per_class).mean()
        total = loss if total is None else total + loss
    return total


def class_probabilities(
    emb_train: torch.Tensor,
    y_train: torch.Tensor,
    emb_test: torch.Tensor,
    tree: list[Node],
    num_classes: int,
    gp: GPSettings,
    chains: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """``[m, num_classes]`` class probabilities of test points (0 outside the client's classes;
    a one-class client gives its class probability 1)."""
    probs = torch.zeros(len(emb_test), num_classes, dtype=emb_test.dtype, device=emb_test.device)
    classes = sorted(int(c) for c in torch.unique(y_train))
    probs[:, classes] = 1.0
    for node in tree:
        idx, labels = _node_data(node, y_train)
        p_left = _left_probability(emb_train[idx], labels, emb_test, gp, chains, generator)
        probs[:, list(node.left)] *= p_left.unsqueeze(1).to(probs.dtype)
        probs[:, list(node.right)] *= (1 - p_left).unsqueeze(1).to(probs.dtype)
    return probs
