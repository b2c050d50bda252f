"""TorchScript models the PyTorch-backend tests build (``model.pt`` files written by torch).

Import only after ``pytest.importorskip("torch")``. Each class is scripted with
``torch.jit.script`` and saved, as a user's export script would do.
"""

from __future__ import annotations

from pathlib import Path

import torch


class AddSub(torch.nn.Module):
    """``forward(x, y) -> (x + y, x - y)``: arguments by name, outputs by index."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + y, x - y


class Mlp(torch.nn.Module):
    """A small MLP with fixed weights (a GPU benchmark and the batching tests' model)."""

    def __init__(self, width: int = 64, depth: int = 2, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        layers: list[torch.nn.Module] = []
        for _ in range(depth):
            lin = torch.nn.Linear(width, width)
            with torch.no_grad():
                lin.weight.copy_(torch.randn(width, width, generator=gen) / width**0.5)
                lin.bias.copy_(torch.randn(width, generator=gen) * 0.1)
            layers += [lin, torch.nn.ReLU()]
        self.body = torch.nn.Sequential(*layers)

    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:  # noqa: N803 - Triton's name
        return self.body(INPUT__0)


class DictIn(torch.nn.Module):
    """One ``Dict[str, Tensor]`` argument: inputs by config name."""

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["a"] * 2 + inputs["b"]


class Upper(torch.nn.Module):
    """``List[str]`` in and out (Triton's TYPE_STRING for PyTorch)."""

    def forward(self, words: list[str]) -> list[str]:
        return [w.upper() for w in words]


class WrongType(torch.nn.Module):
    """Returns int64 where the config will say FP32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.int64)


class Raises(torch.nn.Module):
    """Fails at run time for negative inputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x < 0).any()):
            raise RuntimeError("negative input")
        return x


class Accumulate(torch.nn.Module):
    """A sequence model: ``total = state + x``, reset where start is 1. Its config names
    ``<name>__<index>`` tensors (arguments by index, as state requires)."""

    def forward(
        self, x: torch.Tensor, start: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        total = torch.where(start > 0, x, state + x)
        return total, total


def save(module: torch.nn.Module, path: Path) -> Path:
    """Script ``module`` and save it at ``path`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(module), str(path))
    return path
