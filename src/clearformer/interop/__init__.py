"""Conversions between clearformer and other libraries' layers and checkpoints."""
