"""A Muse Spark model file in the shape of vLLM's, using spark_decode.moe for
the MoE boundaries of every layer. vLLM is not imported: what the file takes
from vLLM (the tensor-parallel GroupCoordinator, weight_loader on
parameters, load_weights over (name, tensor) pairs, processing after
loading, torch.compile of the forward, CUDA graphs) is mimicked with the
same names, so that porting it means replacing the stand-ins.

What is left out: attention, the pre_ffn_norm and the routed experts. The
experts' stand-in (StandInExperts) turns the expert input back into [b, P]
rows with exact arithmetic only (lookup tables of the E2M1 and E4M3 values,
products that fit BF16, powers of two), and the model is compiled with
COMPILE_OPTIONS (Inductor's emulate_precision_casts: a fused chain of BF16
operations rounds after each one, as eager does, instead of once at its
end), so that eager, compiled and stock runs of the model give the same
bits: a test of this model compares the boundaries, not Inductor's
rounding. (The residual adds are where it matters: Inductor may compute
layer 2's input x + y0 + y1 as one FP32 sum, where eager rounds x + y0.)

    python python/examples/muse_spark.py          # one GPU: tp 1, 3 layers, compiled + captured
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch
from torch import nn

from spark_decode.moe import MoeBoundaries, Workspace

# torch.compile's options for a compiled model whose bits must equal the
# eager model's (the tests'); a server that takes Inductor's fused rounding
# leaves them out.
COMPILE_OPTIONS = {"emulate_precision_casts": True}


@dataclasses.dataclass
class MuseSparkConfig:
    """The fields of the model's config this file reads."""

    hidden_size: int = 8192  # H
    moe_hidden_size: int = 4096  # P
    num_hidden_layers: int = 62
    # The routed experts' input per layer: NVFP4 in 1..L-2, BF16 in the edge
    # layers 0 and L-1; "nvfp4_swizzled" for Blackwell's MoE kernels.
    nvfp4_format: str = "nvfp4"
    rms_norm_eps: float = 1e-5
    # Every layer's format, overriding the rule above (small test models).
    layer_formats: tuple[str, ...] | None = None

    def layer_format(self, i: int) -> str:
        if self.layer_formats is not None:
            return self.layer_formats[i]
        return "bf16" if i in (0, self.num_hidden_layers - 1) else self.nvfp4_format


class GroupCoordinator:
    """The attributes of vLLM's GroupCoordinator (get_tp_group()) that
    spark_decode reads: world_size, rank_in_group, cpu_group (gloo: the
    rendezvous) and device_group (NCCL: the stock path's all-gather; None
    where ranks share a GPU, which NCCL refuses)."""

    def __init__(self, world_size: int, rank_in_group: int, cpu_group=None, device_group=None) -> None:
        self.world_size, self.rank_in_group = world_size, rank_in_group
        self.cpu_group, self.device_group = cpu_group, device_group


# Exact values of every E2M1 code (sign in bit 3) and E4M3 byte, as BF16.
_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _e2m1_table() -> torch.Tensor:
    return torch.tensor(_E2M1 + [-v for v in _E2M1], dtype=torch.bfloat16)


def _e4m3_table() -> torch.Tensor:
    table = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
    return torch.nan_to_num(table, nan=0.0).to(torch.bfloat16)


class StandInExperts(nn.Module):
    """Where vLLM's FusedMoE runs. Here: NVFP4 input dequantised as code x
    block scale x 2^-8 (linear or swizzled scales), BF16 input halved."""

    def __init__(self, fmt: str, pooled: int, device: torch.device) -> None:
        super().__init__()
        self.fmt, self.pooled = fmt, pooled
        self.register_buffer("e2m1", _e2m1_table().to(device), persistent=False)
        self.register_buffer("e4m3", _e4m3_table().to(device), persistent=False)

    def forward(self, expert_input) -> torch.Tensor:
        if self.fmt == "bf16":
            return expert_input * 0.5
        a, a_sf = expert_input
        b = a.shape[0]
        codes = torch.stack([a & 15, a >> 4], dim=-1).reshape(b, self.pooled).long()
        sf = a_sf.view(torch.uint8)
        n = self.pooled // 16
        if self.fmt == "nvfp4_swizzled":  # the 128x4 layout (spark_decode/nvfp4.h)
            r = torch.arange(b, device=a.device).unsqueeze(1)
            c = torch.arange(n, device=a.device).unsqueeze(0)
            offset = ((r // 128) * (sf.shape[1] // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
            sf = sf.reshape(-1)[offset]
        scales = self.e4m3[sf.long()].repeat_interleave(16, dim=1)
        return self.e2m1[codes] * scales * 2.0**-8


class MuseSparkMoeLayer(nn.Module):
    """One decoder layer's MoE part: boundaries around the experts, and the residual."""

    def __init__(self, config: MuseSparkConfig, layer_index: int, workspace: Workspace, prefix: str = "") -> None:
        super().__init__()
        fmt = config.layer_format(layer_index)
        self.mlp = MoeBoundaries(workspace, layer_index, format=fmt, eps=config.rms_norm_eps)
        self.experts = StandInExperts(fmt, config.moe_hidden_size, torch.device("cuda", workspace.device))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        expert_input = self.mlp.pre_experts(hidden_states)
        y = self.mlp.post_experts(self.experts(expert_input))
        return hidden_states + y


class MuseSparkForCausalLM(nn.Module):
    """The model, as vLLM builds it: modules first (the workspace once per TP
    group, collective), weights loaded later through load_weights, then
    processed and attached, warmed up, compiled, captured."""

    def __init__(
        self,
        config: MuseSparkConfig,
        tp_group=None,
        *,
        path: str = "fast",
        capacity: int = 16,
        workspace: Workspace | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        # One workspace per TP group, shared by every model of the process
        # (vLLM builds one); tests that build several models pass their own.
        self.workspace = workspace or Workspace.get(
            tp_group, hidden=config.hidden_size, pooled=config.moe_hidden_size, capacity=capacity, path=path
        )
        self.layers = nn.ModuleList(
            MuseSparkMoeLayer(config, i, self.workspace, prefix=f"layers.{i}") for i in range(config.num_hidden_layers)
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return hidden_states

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """vLLM's load_weights: each checkpoint tensor to its parameter's
        weight_loader; then every layer processed and attached, and the
        workspace warmed up (collective)."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            param = params[name]
            param.weight_loader(param, tensor)
            loaded.add(name)
        self.process_weights_after_loading()
        return loaded

    def process_weights_after_loading(self) -> None:
        for module in self.modules():
            if isinstance(module, MoeBoundaries):
                module.process_weights_after_loading()
        self.workspace.warm_up()


def random_checkpoint(config: MuseSparkConfig, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Full (unsharded) weights of the MoE parts, the same on every rank for
    one seed: pooler.weight [P, H], pre_expert_norm.weight [P],
    unpooler.weight [H, P], and the NVFP4 layers' input_global_scale."""
    H, P = config.hidden_size, config.moe_hidden_size
    g = torch.Generator(device=device)
    g.manual_seed(seed)

    def randn(*shape, scale):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(torch.bfloat16)

    weights = {}
    for i in range(config.num_hidden_layers):
        p = f"layers.{i}.mlp."
        weights[p + "pooler.weight"] = randn(P, H, scale=0.02)
        weights[p + "pre_expert_norm.weight"] = randn(P, scale=0.1)
        weights[p + "unpooler.weight"] = randn(H, P, scale=1 / 64)
        if config.layer_format(i) != "bf16":
            weights[p + "input_global_scale"] = torch.tensor([448.0 * 6.0 / (8.0 + i)], device=device)
    return weights


def main() -> None:
    torch.cuda.set_device(0)
    config = MuseSparkConfig(num_hidden_layers=3, nvfp4_format="nvfp4")
    device = torch.device("cuda", 0)
    model = MuseSparkForCausalLM(config)
    model.load_weights(random_checkpoint(config, 1, device).items())
    compiled = torch.compile(model, fullgraph=True, dynamic=True, options=COMPILE_OPTIONS)
    x = torch.randn(8, config.hidden_size, device=device).to(torch.bfloat16)
    eager = model(x)
    compiled(x)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = compiled(x)
    graph.replay()
    torch.cuda.synchronize()
    print("compiled + captured == eager:", torch.equal(captured.view(torch.int16), eager.view(torch.int16)))
    print("paths:", model.layers[1].mlp.path_counts())
    model.workspace.barrier()


if __name__ == "__main__":
    main()
