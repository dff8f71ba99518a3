"""Read a local GGUF file (or a split ``-00001-of-0000N.gguf`` set) into a :class:`ModelInfo`."""

from __future__ import annotations

import re
from pathlib import Path

import gguf

from homelab.errors import ModelFileError
from homelab.gguf.header import ArraySummary, RawHeader, check_data_fits, parse_header
from homelab.gguf.model import MetadataValue, ModelInfo, TensorInfo

SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

# Architectures whose every layer is recurrent (no KV cache at all).
RECURRENT_ARCHS = {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"}
# Hybrids whose recurrent layers are the ones with zero KV heads.
HYBRID_ARCHS = {
    "jamba",
    "falcon-h1",
    "granitehybrid",
    "nemotron_h",
    "nemotron_h_moe",
    "lfm2",
    "plamo2",
}
# Default sliding-window pattern per architecture when the file gives none: (n_pattern, dense_first)
SWA_DEFAULTS = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma3n": (5, False),
    "cohere2": (4, False),
    "gpt-oss": (2, True),
    "exaone4": (4, False),
}


def split_parts(path: Path) -> list[Path]:
    """All files of a split set given any part, or ``[path]`` for a single file."""
    match = SPLIT_RE.match(path.name)
    if not match:
        return [path]
    count = int(match["count"])
    parts = [
        path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)
    ]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise ModelFileError(
            path,
            f"split set is incomplete; missing {', '.join(missing)}",
            hint="Download every part of the set into the same folder.",
        )
    return parts


def read_header_file(path: Path) -> RawHeader:
    try:
        file_bytes = path.stat().st_size
        with path.open("rb") as handle:
            header = parse_header(handle, str(path))
    except FileNotFoundError:
        raise ModelFileError(path, "file not found", hint="Check the path.") from None
    except IsADirectoryError:
        raise ModelFileError(path, "is a directory, not a GGUF file") from None
    except PermissionError:
        raise ModelFileError(
            path, "permission denied", hint="Check the file's permissions."
        ) from None
    check_data_fits(header, file_bytes, str(path))
    return header


def read_model(path: str | Path) -> ModelInfo:
    """Read a GGUF file or split set from disk; raise ModelFileError when it is unusable."""
    first = Path(path).expanduser()
    if not first.exists():
        raise ModelFileError(
            first, "file not found", hint="Check the path or run `homelab models`."
        )
    parts = split_parts(first)
    headers = [read_header_file(part) for part in parts]
    file_bytes = sum(part.stat().st_size for part in parts)
    return model_from_headers(headers, str(parts[0]), file_bytes, default_name=_stem(parts[0]))


def _stem(path: Path) -> str:
    match = SPLIT_RE.match(path.name)
    return match["stem"] if match else path.stem


def model_from_headers(
    headers: list[RawHeader], source: str, file_bytes: int, default_name: str
) -> ModelInfo:
    """Combine the headers of one file or of every part of a split set."""
    _check_split_keys(headers, source)
    meta = headers[0].metadata
    tensors = tuple(
        TensorInfo(t.name, t.ggml_type, t.type_name, t.shape, t.n_bytes, t.offset)
        for header in headers
        for t in header.tensors
    )
    return _ModelBuilder(meta, source).build(tensors, file_bytes, len(headers), default_name)


def _check_split_keys(headers: list[RawHeader], source: str) -> None:
    """The ``split.*`` keys llama.cpp checks must agree with the set of files we found."""
    declared_parts = headers[0].metadata.get("split.count", 1)
    if declared_parts != len(headers):
        found = "a single file" if len(headers) == 1 else f"a set of {len(headers)} files"
        raise ModelFileError(
            source,
            f"its split.count says {declared_parts!r} parts but it was found as {found}",
            hint="Keep the original -0000N-of-0000M.gguf names and download every part.",
        )
    if len(headers) == 1:
        return
    for index, header in enumerate(headers):
        if header.metadata.get("split.no") != index:
            raise ModelFileError(
                source,
                f"part {index + 1} has split.no {header.metadata.get('split.no')!r}, "
                f"expected {index}",
                hint="The parts are mixed up or from different models.",
            )
    declared_tensors = headers[0].metadata.get("split.tensors.count")
    found_tensors = sum(len(header.tensors) for header in headers)
    if declared_tensors != found_tensors:
        raise ModelFileError(
            source,
            f"the split set declares {declared_tensors} tensors but its parts hold {found_tensors}",
            hint="The parts are mixed up or from different models.",
        )


class _ModelBuilder:
    """Turns raw metadata into ModelInfo fields, with llama.cpp's defaults."""

    def __init__(self, meta: dict[str, object], source: str) -> None:
        self.meta = meta
        self.source = source
        arch = meta.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise ModelFileError(
                source,
                "metadata has no general.architecture",
                hint="This is not a llama.cpp model file.",
            )
        self.arch = arch

    def get(self, key: str, default: object = None) -> object:
        return self.meta.get(f"{self.arch}.{key}", default)

    def int_key(self, key: str, default: int = 0) -> int:
        value = self.get(key, default)
        if isinstance(value, tuple):
            value = value[0] if value else default
        if not isinstance(value, int | float):
            raise ModelFileError(
                self.source, f"metadata {self.arch}.{key} is {value!r}, not a number"
            )
        if value < 0 or value > 1 << 40:
            raise ModelFileError(
                self.source, f"metadata {self.arch}.{key} = {value} is out of range"
            )
        return int(value)

    def per_layer(self, key: str, n_layer: int, default: int) -> tuple[int, ...]:
        value = self.get(key, default)
        if isinstance(value, tuple):
            if len(value) != n_layer:
                raise ModelFileError(
                    self.source, f"{self.arch}.{key} has {len(value)} entries for {n_layer} layers"
                )
            return tuple(int(v) for v in value)
        return (self.int_key(key, default),) * n_layer

    def build(
        self, tensors: tuple[TensorInfo, ...], file_bytes: int, n_files: int, default_name: str
    ) -> ModelInfo:
        n_layer = self.int_key("block_count")
        if n_layer <= 0:
            raise ModelFileError(self.source, f"{self.arch}.block_count is missing or zero")
        n_embd = self.int_key("embedding_length")
        n_head = self.per_layer("attention.head_count", n_layer, 0)
        n_head_kv = self.per_layer("attention.head_count_kv", n_layer, max(n_head) if n_head else 0)
        head0 = n_embd // n_head[0] if n_head and n_head[0] else 0
        recurrent = self._recurrent_layers(n_layer, n_head_kv)
        if self.arch in RECURRENT_ARCHS:
            n_head_kv = (0,) * n_layer
        eos = self.meta.get("tokenizer.ggml.eos_token_id")
        bos = self.meta.get("tokenizer.ggml.bos_token_id")
        template = self.meta.get("tokenizer.chat_template")
        return ModelInfo(
            source=self.source,
            architecture=self.arch,
            name=str(self.meta.get("general.name") or default_name),
            file_type=file_type_label(self.meta.get("general.file_type")),
            file_bytes=file_bytes,
            n_files=n_files,
            n_params=sum(t.n_elements for t in tensors),
            context_length=self.int_key("context_length", 2048),
            n_layer=n_layer,
            n_embd=n_embd,
            n_ff=self.per_layer("feed_forward_length", n_layer, 0)[0],
            n_vocab=self._n_vocab(tensors),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim_k=self.int_key("attention.key_length", head0),
            head_dim_v=self.int_key("attention.value_length", head0),
            n_swa=self.int_key("attention.sliding_window", 0),
            swa_layers=self._swa_layers(n_layer),
            kv_lora_rank=self.int_key("attention.kv_lora_rank", 0),
            n_rot=self.int_key("rope.dimension_count", head0),
            n_expert=self.int_key("expert_count", 0),
            n_expert_used=self.int_key("expert_used_count", 0),
            n_expert_shared=self.int_key("expert_shared_count", 0),
            recurrent_layers=recurrent,
            ssm_d_conv=self.int_key("ssm.conv_kernel", 0),
            ssm_d_inner=self.int_key("ssm.inner_size", 0),
            ssm_d_state=self.int_key("ssm.state_size", 0),
            ssm_n_group=self.int_key("ssm.group_count", 0),
            chat_template=template if isinstance(template, str) else None,
            tokenizer_model=str(self.meta.get("tokenizer.ggml.model", "unknown")),
            bos_token_id=bos if isinstance(bos, int) else None,
            eos_token_id=eos if isinstance(eos, int) else None,
            tensors=tensors,
            metadata=_public_metadata(self.meta),
        )

    def _n_vocab(self, tensors: tuple[TensorInfo, ...]) -> int:
        tokens = self.meta.get("tokenizer.ggml.tokens")
        if isinstance(tokens, ArraySummary):
            return tokens.length
        if isinstance(tokens, tuple):
            return len(tokens)
        vocab = self.get("vocab_size")
        if isinstance(vocab, int):
            return vocab
        embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
        return embd.shape[1] if embd and len(embd.shape) > 1 else 0

    def _swa_layers(self, n_layer: int) -> tuple[bool, ...]:
        if self.int_key("attention.sliding_window", 0) <= 0:
            return (False,) * n_layer
        pattern = self.get("attention.sliding_window_pattern")
        if isinstance(pattern, tuple) and len(pattern) == n_layer:
            return tuple(bool(v) for v in pattern)
        n_pattern, dense_first = SWA_DEFAULTS.get(self.arch, (0, False))
        if isinstance(pattern, int) and not isinstance(pattern, bool):
            n_pattern = pattern
        if dense_first:
            return tuple(n_pattern == 0 or il % n_pattern != 0 for il in range(n_layer))
        return tuple(n_pattern == 0 or il % n_pattern < n_pattern - 1 for il in range(n_layer))

    def _recurrent_layers(self, n_layer: int, n_head_kv: tuple[int, ...]) -> tuple[bool, ...]:
        if self.arch in RECURRENT_ARCHS:
            return (True,) * n_layer
        if self.arch in HYBRID_ARCHS:
            return tuple(h == 0 for h in n_head_kv)
        interval = self.int_key("full_attention_interval", 0)
        if interval > 0:
            return tuple((il + 1) % interval != 0 for il in range(n_layer))
        return (False,) * n_layer


def file_type_label(value: object) -> str:
    if not isinstance(value, int):
        return "unknown"
    try:
        name = gguf.LlamaFileType(value).name
    except ValueError:
        return "unknown"
    return name.removeprefix("MOSTLY_").replace("ALL_F32", "F32")


def _public_metadata(meta: dict[str, object]) -> dict[str, MetadataValue]:
    """Scalars as they are; arrays as tuples when short, else ('<array>', length)."""
    result: dict[str, MetadataValue] = {}
    for key, value in meta.items():
        if isinstance(value, ArraySummary):
            result[key] = ("<array>", value.length)
        elif isinstance(value, str | int | float | bool | tuple):
            result[key] = value
    return result
