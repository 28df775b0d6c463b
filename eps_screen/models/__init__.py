"""What a model reference means and the model it loads: hub ids, local paths, packaged and GGUF weights,
the tiny model, a model's shape."""
