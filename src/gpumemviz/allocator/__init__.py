"""A CPU model of PyTorch's CUDA caching allocator: rules, configuration, model, replay."""
