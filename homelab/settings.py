"""The knobs a plan chooses and the engine applies — the contract between planner and engine."""

from __future__ import annotations

from dataclasses import asdict, dataclass

KV_TYPES = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "f32")
# Every other K/V type is quantized in blocks; a quantized V cache needs flash attention.
UNQUANTIZED_KV_TYPES = ("f16", "bf16", "f32")
QUANTIZED_KV_TYPES = tuple(t for t in KV_TYPES if t not in UNQUANTIZED_KV_TYPES)
# The K/V types bench, quality, the TUI and the planner compare by default: 16, 8.5 and 4.5
# bits per value, each a matched pair with fast flash-attention kernels on CUDA as on the CPU.
COMPARED_KV_TYPES = ("f16", "q8_0", "q4_0")


@dataclass(frozen=True)
class Settings:
    """llama.cpp load/context parameters, exactly as handed to llama.cpp.

    ``n_ctx`` is the total context (all slots); ``n_ctx_per_slot`` what one request can use.
    """

    quant: str = "F16"  # the weights file's quant label
    n_ctx: int = 4096
    n_ctx_per_slot: int = 4096
    n_parallel: int = 1  # slots = llama.cpp n_seq_max
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = False
    n_gpu_layers: int = 0
    n_cpu_moe: int = 0  # MoE expert tensors of the first N layers stay on the CPU
    n_batch: int = 2048
    n_ubatch: int = 512
    swa_full: bool = False
    n_threads: int | None = None  # None: llama.cpp's default for this machine
    kv_unified: bool = False
    # llama.cpp RPC workers ("HOST:PORT") whose devices come first in the split, and the
    # planner's explicit tensor split over the offload devices (empty: llama.cpp's default)
    rpc_servers: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()
    # how llama.cpp spreads offloaded layers over several devices: "layer" (by the split),
    # "none" (all on offload device main_gpu: RPC devices first, then local GPUs), "row"
    # (CUDA only: each matrix split by rows)
    split_mode: str = "layer"
    main_gpu: int = 0
    # a vision projector (mmproj GGUF) beside the text model: its path ("" none), whether its
    # weights go to the GPU, and the most tokens one image may take (0: the projector's maximum)
    mmproj_path: str = ""
    mmproj_offload: bool = True
    image_max_tokens: int = 0

    def __post_init__(self) -> None:  # lists from JSON (the dry run, records) become tuples
        object.__setattr__(self, "rpc_servers", tuple(self.rpc_servers))
        object.__setattr__(self, "tensor_split", tuple(float(s) for s in self.tensor_split))

    def to_dict(self) -> dict[str, object]:
        """The settings as JSON shapes (sequences as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
