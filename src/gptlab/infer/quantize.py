"""Weight-only quantisation for inference: int8 per output channel, int4 per group of `group_size` inputs.

    int8   w[n, k] ~ q[n, k] * scale[n]                       q in -127..127, scale = max|w[n, :]| / 127
    int4   w[n, k] ~ code[n, k] * scale[n, g] + low[n, g]     code in 0..15, g = k // group_size,
                                                              scale = (max - min) / 15 and low = min over the group

`quantize_model(model, scheme)` swaps, in place, every nn.Linear of the transformer blocks and the output
layer for a `QuantizedLinear`, and the token embedding for an int8 `QuantizedEmbedding` (each row with its scale).
Activations stay in floating point (weight-only: the weights' memory and bandwidth shrink, the arithmetic does not).

The embedding, measured on the GPT-2 (124M) shape (bench/quantize.py): its table (50304 x 768) is 154 MB of the
model's 498 MB in fp32. Leaving it in fp32 while quantising a tied output layer would add the head's quantised copy
on top of it; so the table is quantised too, to int8 per row, which a lookup reads as cheaply as fp32. A tied output
layer shares that int8 matrix under both schemes (the tie is kept): an int4 head beside the int8 table made the
int4 model 120 MB, sharing makes it 96 MB (int8: 128 MB), for a slower head (int8 kernel 5.0 ms vs int4 2.7 ms per
token on 1 thread). An untied output layer follows the scheme. Learned position tables stay as they are (small).
int4 groups run along a layer's inputs; where group_size does not divide them (a width of 48 and groups of 32),
the weight gets zero columns and each input zeros up to the next multiple: those columns meet only zeros and add
nothing to the output (the last group's range spans the zeros too), for a few more multiply-adds.
Mixture-of-experts expert stacks (gptlab.model.moe) and their routers stay in full precision: the swap skips
everything inside a MoE layer and refuses nothing.

The readable reference is `quantize_int8` / `quantize_int4` and `dequantize_int8` / `dequantize_int4` below, and
`QuantizedLinear.reference` (dequantise, then F.linear). The fast path is PyTorch's own weight-only kernels:
`torch._weight_int8pack_mm` and, for int4, `torch._convert_weight_to_int4pack_for_cpu` +
`torch._weight_int4pack_mm_for_cpu` on a CPU, `torch._convert_weight_to_int4pack` + `torch._weight_int4pack_mm`
(tinygemm) on CUDA. Measured on this CPU (AVX-512, 1 thread, 768 -> 2304, one row): fp32 F.linear 0.15 ms;
int8 kernel with fp32 activations 1.45 ms (9x slower), with bf16 activations 0.10 ms; int4 with fp32 activations
3.0 ms, with bf16 0.11 ms. So the fast path runs the kernels on bf16 activations and returns the model's dtype.
On CUDA int8 is dequantised into a bf16 matmul (the memory saving holds; the speed is the bf16 GEMM's).
The int4 kernels' layout is opaque and device-specific: quantise after moving the model to its device.
The kernels take int4's scale and zero in bf16 (and int8's scale, beside the fp32 one): a module's weights are
the readable ones up to that rounding (measured: a few percent of a step), within the bf16 tolerance of the tests.

Not here: loading (gptlab.load.model_folders), the `--quantize` flag (gptlab.cli.common).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptlab.model import GPT
from gptlab.model.moe import MoE
from gptlab.runtime import GptlabError

SCHEMES = ("int8", "int4")
GROUP_SIZES = (32, 64, 128, 256)  # what the int4 kernels accept, on CPU and CUDA
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KERNEL_DTYPE = torch.bfloat16  # the activations' dtype inside the kernels: fast on CPU (see above), required by tinygemm


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float -> q (N, K) int8 and scale (N,) float32, symmetric per output row: w ~ q * scale."""
    weight = weight.float()
    scale = (weight.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)  # an all-zero row: codes 0
    q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[:, None]


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, K) float -> codes (N, K) uint8 in 0..15, scale and low (N, K // group_size) float32: w ~ code * scale + low.

    Asymmetric (min to max of each group), so a group's smallest and largest weights are exact up to rounding."""
    N, K = weight.shape
    groups = weight.float().reshape(N, K // group_size, group_size)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)  # a constant group: codes 0, w = low
    codes = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
    return codes.reshape(N, K), scale, low


def dequantize_int4(codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    N, K = codes.shape
    groups = codes.float().reshape(N, scale.shape[1], -1)
    return (groups * scale.float()[..., None] + low.float()[..., None]).reshape(N, K)


def _pad_rows(tensor: torch.Tensor, multiple: int) -> torch.Tensor:
    """Zero rows appended up to a multiple (the int4 packers want N divisible by 16); the extra outputs are cut."""
    extra = -tensor.shape[0] % multiple
    return torch.cat([tensor, tensor.new_zeros(extra, *tensor.shape[1:])]) if extra else tensor


def _pack_int4(codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' operands: packed codes, and scales_and_zeros (K // group, N, 2) bf16 where the kernels compute
    w = (code - 8) * scale + zero, so zero = low + 8 * scale."""
    codes, scale, low = _pad_rows(codes, 16), _pad_rows(scale, 16), _pad_rows(low, 16)
    scales_and_zeros = torch.stack([scale, low + 8 * scale], dim=-1).transpose(0, 1).contiguous().to(KERNEL_DTYPE)
    if codes.device.type == "cuda":
        inner_k_tiles = next(tiles for tiles in (8, 4, 2) if codes.shape[1] % (tiles * 16) == 0)
        nibbles = (codes[:, ::2] << 4 | codes[:, 1::2]).contiguous()  # two codes a byte, the even one high
        return torch._convert_weight_to_int4pack(nibbles, inner_k_tiles), scales_and_zeros
    return torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1), scales_and_zeros


class QuantizedLinear(nn.Module):
    """y = x W^T + b with W stored as int8 or int4 codes (module docstring). `forward` runs the kernels;
    `reference` is the readable dequantise-then-F.linear that the fast path is tested against."""

    def __init__(self, linear: nn.Linear, scheme: str, group_size: int = 32, *, int8=None) -> None:
        super().__init__()
        self.scheme, self.group_size = scheme, group_size
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.padded_in = self.in_features  # int4: the inputs as the kernels see them (a multiple of group_size)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        weight = linear.weight.detach()
        if scheme == "int8":
            q, scale = int8 if int8 is not None else quantize_int8(weight)  # a tied embedding's matrix, shared
            self.register_buffer("q", q)
            self.register_buffer("scale", scale)
            self.register_buffer("kernel_scale", scale.to(KERNEL_DTYPE), persistent=False)
        else:  # inputs the groups do not divide: zero columns up to a multiple; they meet zero inputs, adding nothing
            self.padded_in = self.in_features + -self.in_features % group_size
            weight = F.pad(weight, (0, self.padded_in - self.in_features))
            packed, scales_and_zeros = _pack_int4(*quantize_int4(weight, group_size))
            self.register_buffer("packed", packed)
            self.register_buffer("scales_and_zeros", scales_and_zeros)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(KERNEL_DTYPE)
        flat = (F.pad(flat, (0, self.padded_in - self.in_features)) if self.padded_in > self.in_features else flat).contiguous()
        if self.scheme == "int8" and x.device.type == "cuda":
            y = F.linear(flat, self.q.to(KERNEL_DTYPE)) * self.kernel_scale
        elif self.scheme == "int8":
            y = torch._weight_int8pack_mm(flat, self.q, self.kernel_scale)
        elif x.device.type == "cuda":
            y = torch._weight_int4pack_mm(flat, self.packed, self.group_size, self.scales_and_zeros)
        else:
            y = torch._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size, self.scales_and_zeros)
        y = y[:, : self.out_features].to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def dequantize(self) -> torch.Tensor:
        """The (N, K) float32 weight the codes stand for. int4: read back through the kernel on the identity (its
        layout is opaque), as torchao's int4 layouts do: exact on a CPU (fp32 in and out), bf16-rounded on CUDA."""
        if self.scheme == "int8":
            return dequantize_int8(self.q, self.scale)
        identity = torch.eye(self.padded_in, device=self.packed.device)
        if identity.device.type == "cuda":
            columns = torch._weight_int4pack_mm(identity.to(KERNEL_DTYPE), self.packed, self.group_size, self.scales_and_zeros)
        else:
            columns = torch._weight_int4pack_mm_for_cpu(identity, self.packed, self.group_size, self.scales_and_zeros.float())
        return columns[: self.in_features, : self.out_features].float().t().contiguous()

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The readable path: the dequantised weight, then F.linear in float32."""
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.dequantize(), bias).to(x.dtype)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.scheme == "int4" else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme}{group}"


class QuantizedEmbedding(nn.Module):
    """Token lookup from int8 rows, each with its scale: row[i] ~ q[i] * scale[i], returned in `dtype`."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        self.dtype = dtype

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(idx, self.q).to(self.dtype)
        return rows * self.scale[idx].unsqueeze(-1).to(self.dtype)


def check_quantizable(model: GPT, scheme: str, group_size: int) -> tuple[torch.device, torch.dtype]:
    """One clear error for each thing the kernels cannot take, before anything is changed."""
    if scheme not in SCHEMES:
        raise GptlabError(f"unknown quantisation scheme {scheme!r}; use one of {', '.join(SCHEMES)} (or none: no --quantize)")
    if any(isinstance(module, (QuantizedLinear, QuantizedEmbedding)) for module in model.modules()):
        raise GptlabError("this model is already quantised; quantise a model once, from its unquantised weights")
    weight = model.lm_head.weight
    if weight.device.type not in ("cpu", "cuda"):
        raise GptlabError(f"--quantize runs on cpu or cuda, and the model is on {weight.device}; use --device cpu")
    if weight.dtype not in DTYPES:
        raise GptlabError(f"--quantize takes a float32, bfloat16 or float16 model, and this one is {weight.dtype}; convert it first")
    if scheme == "int4":
        if group_size not in GROUP_SIZES:
            raise GptlabError(f"int4 group_size must be one of {', '.join(map(str, GROUP_SIZES))} (the kernels'), got {group_size}")
        if weight.device.type == "cuda" and torch.cuda.get_device_capability(weight.device)[0] < 8:
            raise GptlabError(f"int4 on CUDA needs compute capability 8.0 or newer (tinygemm); {weight.device} is older: use int8")
    return weight.device, weight.dtype


def _linears(model: GPT) -> list[tuple[str, nn.Linear]]:
    """The nn.Linear modules to swap: those of the blocks (not inside a MoE layer) and the output layer."""
    skipped = [name + "." for name, module in model.named_modules() if isinstance(module, MoE)]
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and not any(name.startswith(prefix) for prefix in skipped)
            and (name.startswith("transformer.h.") or name == "lm_head")]


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


@torch.no_grad()
def quantize_model(model: GPT, scheme: str, *, group_size: int = 32) -> GPT:
    """Swap the model's linear layers (and token embedding) for quantised ones, in place; returns the model.

    scheme "int8" | "int4"; group_size: inputs per int4 group (32, 64, 128 or 256; a layer whose inputs it does not
    divide gets zero columns up to a multiple, so any width quantises)."""
    _, dtype = check_quantizable(model, scheme, group_size)
    tied = model.lm_head.weight is model.transformer["wte"].weight
    table = quantize_int8(model.transformer["wte"].weight.detach())
    for name, linear in _linears(model):
        if name == "lm_head" and tied:  # one int8 matrix for both: an int4 head beside it would add memory (docstring)
            _replace(model, name, QuantizedLinear(linear, "int8", int8=table))
        else:
            _replace(model, name, QuantizedLinear(linear, scheme, group_size))
    model.transformer["wte"] = QuantizedEmbedding(*table, dtype)
    return model.eval()


def quantized_bytes(model: nn.Module) -> int:
    """Bytes of the parameters and buffers, each storage counted once (a tied matrix is one)."""
    seen: dict[int, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())
