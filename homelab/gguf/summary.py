"""What a GGUF file (or split set) says about its model, as plain data and as text
(``homelab inspect``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from homelab.gguf.model import ModelInfo
from homelab.units import format_mib


def summarize(info: ModelInfo, *, with_tensors: bool = False) -> dict[str, Any]:
    """The model's description as plain JSON-able data (what ``--json`` prints)."""
    summary: dict[str, Any] = {
        "path": info.source,
        "name": info.name,
        "architecture": info.architecture,
        "n_params": info.n_params,
        "quant": info.file_type,
        "file_bytes": info.file_bytes,
        "n_files": info.n_files,
        "weights_bytes": info.weights_bytes,
        "n_layer": info.n_layer,
        "n_embd": info.n_embd,
        "n_ff": info.n_ff,
        "n_head": _uniform_or_list(info.n_head),
        "n_head_kv": _uniform_or_list(info.n_head_kv),
        "head_dim_k": info.head_dim_k,
        "head_dim_v": info.head_dim_v,
        "swa": {"window": info.n_swa, "n_layers": sum(info.swa_layers)} if info.has_swa else None,
        "mla": {"kv_lora_rank": info.kv_lora_rank, "rope_dim": info.n_rot} if info.is_mla else None,
        "experts": _experts(info),
        "recurrent": _recurrent(info),
        "context_length": info.context_length,
        "n_vocab": info.n_vocab,
        "tokenizer": info.tokenizer_model,
        "chat_template": info.chat_template is not None,
        "tensor_count": len(info.tensors),
        "tensor_types": dict(Counter(t.type_name for t in info.tensors).most_common()),
    }
    if with_tensors:
        summary["tensors"] = [
            {"name": t.name, "type": t.type_name, "shape": list(t.shape), "bytes": t.n_bytes}
            for t in info.tensors
        ]
    return summary


def _uniform_or_list(values: tuple[int, ...]) -> int | list[int]:
    return values[0] if values and len(set(values)) == 1 else list(values)


def _experts(info: ModelInfo) -> dict[str, int] | None:
    if not info.is_moe:
        return None
    return {"n": info.n_expert, "used": info.n_expert_used, "shared": info.n_expert_shared}


def _recurrent(info: ModelInfo) -> dict[str, int] | None:
    if not info.is_recurrent:
        return None
    return {
        "n_layers": sum(info.recurrent_layers),
        "d_conv": info.ssm_d_conv,
        "d_inner": info.ssm_d_inner,
        "d_state": info.ssm_d_state,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The human-readable report."""
    rows = [
        ("model", f"{summary['name']} ({summary['architecture']})"),
        ("file", _file_line(summary)),
        ("parameters", f"{_count(summary['n_params'])} ({summary['quant']})"),
        ("layers", str(summary["n_layer"])),
        ("embedding", f"{summary['n_embd']}, feed-forward {summary['n_ff']}"),
        ("heads", f"{_per_layer(summary['n_head'])}, KV heads {_per_layer(summary['n_head_kv'])}"),
        ("head dims", f"K {summary['head_dim_k']}, V {summary['head_dim_v']}"),
        ("sliding window", _optional(summary["swa"], "{window} tokens on {n_layers} layers")),
        ("MLA", _optional(summary["mla"], "KV LoRA rank {kv_lora_rank}, rope dim {rope_dim}")),
        ("experts", _optional(summary["experts"], "{n} routed ({used} used), {shared} shared")),
        ("recurrent", _optional(summary["recurrent"], "{n_layers} layers, d_state {d_state}")),
        ("context", f"{summary['context_length']:,} tokens (trained)"),
        ("vocabulary", f"{summary['n_vocab']:,} tokens ({summary['tokenizer']})"),
        ("chat template", "yes" if summary["chat_template"] else "no"),
        ("tensors", _tensor_line(summary)),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    for tensor in summary.get("tensors", []):
        shape = "x".join(str(dim) for dim in tensor["shape"])
        lines.append(f"  {tensor['name']:<40} {tensor['type']:<7} {shape:<20} {tensor['bytes']:,}")
    return "\n".join(lines)


def _file_line(summary: dict[str, Any]) -> str:
    parts = f", {summary['n_files']} parts" if summary["n_files"] > 1 else ""
    return f"{summary['path']} ({format_mib(summary['file_bytes'])}{parts})"


def _tensor_line(summary: dict[str, Any]) -> str:
    by_type = ", ".join(f"{name} {count}" for name, count in summary["tensor_types"].items())
    return f"{summary['tensor_count']} ({by_type})"


def _optional(value: dict[str, int] | None, template: str) -> str:
    return "no" if value is None else template.format(**value)


def _per_layer(value: int | list[int]) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{min(value)}..{max(value)} per layer"


def _count(n: int) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)
