"""The framework-free serving machinery: the model registry (loading, leases, reloads) and the micro-batcher."""
