"""FedRolex (Alam, Liu, Yan, Zhang, NeurIPS 2022): HeteroFL with rolling sub-models.

Identical to :mod:`fedhp.algorithms.heterofl` except for which units a sub-model of width z
holds: in round r, the max(1, round(z·J)) units (r + i) mod J of each hidden layer of J units
(the window rolls by one unit per round), so every unit of the global model is trained by small
devices in turn instead of only the first ones.
"""

from __future__ import annotations

from fedhp.algorithms.heterofl import HeteroFL, HeteroFLOptions
from fedhp.algorithms.options import ALGORITHMS


class FedRolex(HeteroFL):
    """HeteroFL's rounds on a window of units that advances by one every round."""

    def window_offset(self, rnd: int) -> int:
        return rnd


@ALGORITHMS.register("fedrolex")
class FedRolexOptions(HeteroFLOptions):
    """FedRolex: rolling sub-models of width s = z per client, averaged as HeteroFL's."""

    algorithm_class = FedRolex
