"""The vectorized simulator: all clients trained at once as batched tensors."""
