"""fedhp: personalized, hierarchical and sparse federated learning, vectorized over clients."""

__version__ = "0.1.0"
