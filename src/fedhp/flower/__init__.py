"""fedhp on Flower: the ServerApp (``fedhp.flower.server_app:app``, the cloud) and the ClientApp
(``fedhp.flower.client_app:app``, a node hosting edges with their clients, or a client shard),
running the same algorithm code as the in-process engine. See docs/flower.md.

Importing this package does not import Flower; the submodules do.
"""
