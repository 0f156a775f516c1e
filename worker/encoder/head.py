"""What a sentence-transformers folder does to the pooled vector: its ``Dense`` modules (a
linear layer and an activation each), then ``truncate_dim``, as sentence-transformers'
``encode`` does. Runs in float32 on the encoder's device whatever the transformer's dtype
(the layers are small; the pooled rows are float32 already).

A ``Normalize`` module is the request's ``normalize`` (default true), applied when results
are made, after ``dimensions`` (as TEI does): ``normalize: false`` returns the vectors as
they enter that module. Vectors are cut to ``truncate_dim`` before normalizing rather than
after, which changes their length only, never their direction."""

from __future__ import annotations

from collections.abc import Callable

import torch

from worker.encoder.folder import DenseLayer, ModelFolder

__all__ = ["Head"]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Identity": lambda x: x,
    "Tanh": torch.tanh,
    "Sigmoid": torch.sigmoid,
    "ReLU": torch.relu,
    "GELU": torch.nn.functional.gelu,
    "SiLU": torch.nn.functional.silu,
}


class Head:
    def __init__(self, folder: ModelFolder, device: torch.device) -> None:
        self._layers = [_load_dense(layer, device) for layer in folder.dense]
        self._truncate_dim = folder.truncate_dim

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        rows = pooled
        for weight, bias, activation in self._layers:
            rows = activation(torch.nn.functional.linear(rows, weight, bias))
        if self._truncate_dim is not None:
            rows = rows[:, : self._truncate_dim]
        return rows


def _load_dense(
    layer: DenseLayer, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None, Callable[[torch.Tensor], torch.Tensor]]:
    if layer.path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(layer.path))
    else:
        state = torch.load(layer.path, map_location="cpu", weights_only=True)
    weight = state.get("linear.weight")
    if weight is None or tuple(weight.shape) != (layer.out_features, layer.in_features):
        raise ValueError(
            f"{layer.path}: expected linear.weight of shape "
            f"({layer.out_features}, {layer.in_features})"
        )
    bias = state.get("linear.bias") if layer.bias else None
    if layer.bias and bias is None:
        raise ValueError(f"{layer.path}: the Dense config has a bias, the weights do not")
    moved = None if bias is None else bias.float().to(device)
    return weight.float().to(device), moved, _ACTIVATIONS[layer.activation]
