"""A catalogue of popular GGUF models, so planning works offline for files the user doesn't have.

The data lives in ``profiles/models.toml`` (its top comment documents the schema). Each entry
holds the hyperparameters llama.cpp would read from the GGUF header, the Hugging Face repo of a
popular conversion and the byte size of its quant files.

:meth:`CatalogueEntry.model_info` turns an entry into a :class:`~homelab.gguf.model.ModelInfo`
with *synthetic tensors*, so the planner treats a catalogue model exactly like a file:

* ``token_embd.weight``, then per layer ``blk.N.attn`` (every attention weight and norm of the
  layer as one lump) and either ``blk.N.ffn`` (the dense FFN as one lump) or the MoE tensors
  ``blk.N.ffn_gate_inp.weight``, ``blk.N.ffn_{gate,up,down}_exps.weight`` (``is_expert``) and
  ``blk.N.ffn_shexp`` (shared experts), ``blk.N.nextn`` for multi-token-prediction layers, then
  ``output_norm.weight`` and ``output.weight`` (absent when the embeddings are tied).
* Each tensor is first sized from its element count at the bits per weight llama.cpp's quant
  recipe gives it (:data:`QUANT_RECIPES`), then every quantized tensor is scaled by one common
  factor so that the tensor bytes sum **exactly** to the file size minus
  :func:`header_bytes_estimate` (64 KiB per file plus 64 bytes per vocabulary entry: the
  tokenizer arrays dominate a header). F32 tensors (norms, router) keep their exact size. The
  factor stays within 1% of 1 for every file in the catalogue (the recipe reproduces the listed
  sizes of Llama 3.1 8B, Llama 3.3 70B, Mistral Nemo and others within 0.7%).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import gguf

from homelab.errors import ConfigError, PlanError
from homelab.gguf.model import MetadataValue, ModelInfo, TensorInfo
from homelab.locations import profiles_dir

CATALOGUE_FILE = "models.toml"
HEADER_BYTES_PER_FILE = 64 * 1024
HEADER_BYTES_PER_TOKEN = 64

# Quant labels from best to worst; labels not listed sort after these, largest file first.
QUALITY_ORDER = ("F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "MXFP4_MOE", "IQ4_XS", "Q3_K_M")


def type_bits_per_weight(type_name: str) -> float:
    """Exact storage bits per weight of a ggml type (block bytes × 8 / block elements)."""
    block_elements, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return block_bytes * 8 / block_elements


@dataclass(frozen=True)
class QuantRecipe:
    """The ggml types a llama-quantize preset gives each kind of tensor.

    ``layer_bits`` is the *effective* bits per weight of the block matrices: the presets keep
    some of them (attn_v, ffn_down on about half the layers) at a higher type. The values were
    checked against Llama-3.1-8B's listed file sizes (within 1%).
    """

    layer_type: str  # type reported for the layer lumps
    layer_bits: float
    embd_type: str  # token_embd when the output head is a separate tensor
    output_type: str  # output.weight; also token_embd when the embeddings are tied
    expert_type: str | None = None  # None: experts follow the layer recipe

    @property
    def expert_bits(self) -> float:
        if self.expert_type is None:
            return self.layer_bits
        return type_bits_per_weight(self.expert_type)


QUANT_RECIPES: Mapping[str, QuantRecipe] = {
    "F16": QuantRecipe("F16", 16.0, "F16", "F16"),
    "BF16": QuantRecipe("BF16", 16.0, "BF16", "BF16"),
    "Q8_0": QuantRecipe("Q8_0", 8.5, "Q8_0", "Q8_0"),
    "Q6_K": QuantRecipe("Q6_K", 6.5625, "Q6_K", "Q6_K"),
    "Q5_K_M": QuantRecipe("Q5_K", 5.65, "Q5_K", "Q6_K"),
    "Q4_K_M": QuantRecipe("Q4_K", 4.80, "Q4_K", "Q6_K"),
    "IQ4_XS": QuantRecipe("IQ4_XS", 4.27, "IQ4_XS", "Q6_K"),
    "Q3_K_M": QuantRecipe("Q3_K", 3.85, "Q3_K", "Q6_K"),
    # gpt-oss as OpenAI released it: experts MXFP4, everything else Q8_0.
    "MXFP4_MOE": QuantRecipe("Q8_0", 8.5, "Q8_0", "Q8_0", expert_type="MXFP4"),
}


@dataclass(frozen=True)
class QuantFile:
    """One quant of a catalogue model as its repo lists it (a split set is one entry)."""

    quant: str  # e.g. "Q4_K_M"
    file: str  # path in the repo; the first part of a split set
    size_bytes: int  # total of all parts
    n_files: int
    size_estimated: bool  # True: computed from parameters × bits per weight, not listed
    size_note: str  # where the size comes from


@dataclass(frozen=True)
class CatalogueEntry:
    """One model of ``profiles/models.toml``; field names are the TOML keys."""

    slug: str
    display_name: str
    architecture: str  # as llama.cpp names it (general.architecture)
    hf_repo: str  # the GGUF conversion
    base_repo: str  # the original model
    source: str  # where the hyperparameters come from
    n_params: int  # as the model card / safetensors index states it
    context_length: int
    n_layer: int  # GGUF block_count, including multi-token-prediction layers
    n_embd: int
    n_ff: int  # dense FFN width
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    n_rot: int
    tokenizer_model: str
    tied_embeddings: bool = False
    aliases: tuple[str, ...] = ()
    n_swa: int = 0
    swa_pattern: int = 0  # every swa_pattern-th layer is global (llama.cpp set_swa_pattern)
    swa_dense_first: bool = False  # True: the global layer opens each group instead of closing it
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    mla_key_length: int = 0  # per-head K width before compression (nope + rope)
    mla_value_length: int = 0
    n_expert: int = 0
    n_expert_used: int = 0
    n_expert_shared: int = 0
    n_ff_exp: int = 0
    n_layer_dense_lead: int = 0  # leading layers with a dense FFN in an MoE model
    n_layer_nextn: int = 0  # trailing multi-token-prediction layers stored in the file
    files: tuple[QuantFile, ...] = ()

    @property
    def quants(self) -> tuple[QuantFile, ...]:
        """The available quant files, best first."""
        return tuple(sorted(self.files, key=_quality_key))

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def names(self) -> tuple[str, ...]:
        """Every name :func:`find_model` accepts for this entry."""
        return (self.slug, self.display_name, self.hf_repo, self.base_repo, *self.aliases)

    def quant_file(self, quant: str) -> QuantFile:
        for candidate in self.files:
            if candidate.quant.lower() == quant.strip().lower():
                return candidate
        known = ", ".join(f.quant for f in self.quants)
        raise PlanError(
            f"The catalogue has no {quant!r} file for {self.display_name}.",
            hint=f"Available quants: {known}.",
        )

    def swa_layers(self) -> tuple[bool, ...]:
        return tuple(_is_swa_layer(self, layer) for layer in range(self.n_layer))

    def model_info(self, quant: str) -> ModelInfo:
        """A ModelInfo for this model's ``quant`` file with synthetic tensors (see the module)."""
        quant_file = self.quant_file(quant)
        recipe = QUANT_RECIPES[quant_file.quant]
        target_bytes = quant_file.size_bytes - header_bytes_estimate(self, quant_file.n_files)
        tensors = _place(_scale_to(_synthetic_tensors(self, recipe), target_bytes))
        return _build_model_info(self, quant_file, tensors)


def header_bytes_estimate(entry: CatalogueEntry, n_files: int = 1) -> int:
    """Bytes of a GGUF file set that are not tensor data (metadata, tokenizer, tensor index)."""
    return HEADER_BYTES_PER_FILE * n_files + HEADER_BYTES_PER_TOKEN * entry.n_vocab


def estimate_file_bytes(entry: CatalogueEntry, quant: str, n_files: int = 1) -> int:
    """The file size the quant recipe predicts (used for sizes the repo listing doesn't give)."""
    tensors = _synthetic_tensors(entry, QUANT_RECIPES[quant])
    return sum(t.raw_bytes for t in tensors) + header_bytes_estimate(entry, n_files)


# --- loading and lookup ---------------------------------------------------------------------


def catalogue_path() -> Path:
    return profiles_dir() / CATALOGUE_FILE


def load_catalogue(path: Path | None = None) -> dict[str, CatalogueEntry]:
    """Every catalogue entry by slug, from ``profiles/models.toml`` (or ``path``)."""
    return dict(_load_cached(path or catalogue_path()))


def find_model(name: str, path: Path | None = None) -> CatalogueEntry:
    """The entry whose slug, display name, repo (GGUF or original) or alias is ``name``.

    Case-insensitive; raises PlanError listing the known slugs when nothing matches.
    """
    wanted = _normalise_name(name)
    catalogue = load_catalogue(path)
    for entry in catalogue.values():
        if wanted in {_normalise_name(known) for known in entry.names()}:
            return entry
    raise PlanError(
        f"{name!r} is not in the model catalogue.",
        hint=f"Known models: {', '.join(sorted(catalogue))}. Or give the path of a GGUF file.",
    )


def _normalise_name(name: str) -> str:
    cleaned = name.strip().lower().removeprefix("https://huggingface.co/")
    return cleaned.removeprefix("hf.co/").strip("/")


@functools.lru_cache(maxsize=4)
def _load_cached(path: Path) -> tuple[tuple[str, CatalogueEntry], ...]:
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: the model catalogue is missing.") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}).") from exc
    models = document.get("models")
    if not isinstance(models, dict) or not models:
        raise ConfigError(f"{path}: expected [models.<slug>] tables.")
    return tuple((slug, _parse_entry(path, slug, table)) for slug, table in models.items())


_ENTRY_FIELDS = {f.name: f for f in dataclasses.fields(CatalogueEntry)}
_FILE_FIELDS = {f.name: f for f in dataclasses.fields(QuantFile)}


def _parse_entry(path: Path, slug: str, table: object) -> CatalogueEntry:
    where = f"{path}: model {slug!r}"
    values = _checked_values(where, table, _ENTRY_FIELDS, skip={"slug", "files"})
    raw_files = table.get("files", []) if isinstance(table, dict) else []
    files = tuple(_parse_file(f"{where} file {i + 1}", raw) for i, raw in enumerate(raw_files))
    if not files:
        raise ConfigError(f"{where}: lists no quant files.")
    entry = CatalogueEntry(slug=slug, files=files, **values)  # type: ignore[arg-type]
    _check_consistency(where, entry)
    return entry


def _parse_file(where: str, table: object) -> QuantFile:
    values = _checked_values(where, table, _FILE_FIELDS, skip=set())
    quant_file = QuantFile(**values)  # type: ignore[arg-type]
    if quant_file.quant not in QUANT_RECIPES:
        raise ConfigError(f"{where}: unknown quant {quant_file.quant!r}.")
    return quant_file


def _checked_values(
    where: str, table: object, fields: Mapping[str, dataclasses.Field[object]], skip: set[str]
) -> dict[str, object]:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table.")
    unknown = set(table) - set(fields) - skip
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}.")
    values: dict[str, object] = {}
    for name, spec in fields.items():
        if name in skip:
            continue
        if name not in table:
            if spec.default is dataclasses.MISSING:
                raise ConfigError(f"{where}: missing required key {name!r}.")
            continue
        values[name] = _checked_value(where, name, spec, table[name])
    return values


def _checked_value(where: str, name: str, spec: dataclasses.Field[object], value: object) -> object:
    expected = str(spec.type)
    if expected.startswith("tuple"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: {name} must be a list of strings.")
        return tuple(value)
    python_type = {"int": int, "str": str, "bool": bool}[expected]
    if type(value) is not python_type:
        raise ConfigError(f"{where}: {name} must be {expected}, got {value!r}.")
    return value


def _check_consistency(where: str, entry: CatalogueEntry) -> None:
    if entry.n_swa and entry.swa_pattern < 1:
        raise ConfigError(f"{where}: n_swa needs swa_pattern.")
    if entry.is_moe and not (entry.n_expert_used and entry.n_ff_exp):
        raise ConfigError(f"{where}: MoE models need n_expert_used and n_ff_exp.")
    if entry.is_mla and not (entry.mla_key_length and entry.mla_value_length):
        raise ConfigError(f"{where}: MLA models need mla_key_length and mla_value_length.")


def _quality_key(quant_file: QuantFile) -> tuple[int, int]:
    label = quant_file.quant
    rank = QUALITY_ORDER.index(label) if label in QUALITY_ORDER else len(QUALITY_ORDER)
    return rank, -quant_file.size_bytes


def _is_swa_layer(entry: CatalogueEntry, layer: int) -> bool:
    """llama.cpp's set_swa_pattern; multi-token-prediction layers never use the window."""
    if entry.n_swa == 0 or layer >= entry.n_layer - entry.n_layer_nextn:
        return False
    if entry.swa_dense_first:
        return layer % entry.swa_pattern != 0
    return layer % entry.swa_pattern < entry.swa_pattern - 1


# --- synthetic tensors ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Lump:
    """A synthetic tensor before scaling: raw_bytes at the recipe's bits per weight."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    raw_bytes: int
    scalable: bool  # False for F32 tensors, whose size is exact

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


def _quantized(name: str, type_name: str, shape: tuple[int, ...], bits: float) -> _Lump:
    return _Lump(name, type_name, shape, math.ceil(math.prod(shape) * bits / 8), True)


def _f32(name: str, shape: tuple[int, ...]) -> _Lump:
    return _Lump(name, "F32", shape, math.prod(shape) * 4, False)


def _lump(name: str, type_name: str, bits: float, weights: int, f32_values: int) -> _Lump:
    """A 1-D stand-in for several tensors: ``weights`` quantized elements plus F32 norms/biases."""
    raw = math.ceil(weights * bits / 8) + 4 * f32_values
    return _Lump(name, type_name, (weights + f32_values,), raw, True)


def _synthetic_tensors(entry: CatalogueEntry, recipe: QuantRecipe) -> list[_Lump]:
    embd_type = recipe.output_type if entry.tied_embeddings else recipe.embd_type
    lumps = [_matrix("token_embd.weight", embd_type, (entry.n_embd, entry.n_vocab))]
    for layer in range(entry.n_layer):
        lumps.extend(_layer_tensors(entry, recipe, layer))
    lumps.append(_f32("output_norm.weight", (entry.n_embd,)))
    if not entry.tied_embeddings:
        lumps.append(_matrix("output.weight", recipe.output_type, (entry.n_embd, entry.n_vocab)))
    return lumps


def _matrix(name: str, type_name: str, shape: tuple[int, ...]) -> _Lump:
    return _quantized(name, type_name, shape, type_bits_per_weight(type_name))


def _layer_tensors(entry: CatalogueEntry, recipe: QuantRecipe, layer: int) -> list[_Lump]:
    prefix = f"blk.{layer}"
    weights, norms = _mla_counts(entry) if entry.is_mla else _attention_counts(entry)
    lumps = [_lump(f"{prefix}.attn", recipe.layer_type, recipe.layer_bits, weights, norms)]
    if entry.is_moe and layer >= entry.n_layer_dense_lead:
        lumps.extend(_moe_tensors(entry, recipe, prefix))
    else:
        ffn_weights = 3 * entry.n_embd * entry.n_ff
        lumps.append(_lump(f"{prefix}.ffn", recipe.layer_type, recipe.layer_bits, ffn_weights, 0))
    if layer >= entry.n_layer - entry.n_layer_nextn:
        nextn_weights = 2 * entry.n_embd * entry.n_embd  # eh_proj; enorm, hnorm, shared norm
        lumps.append(
            _lump(
                f"{prefix}.nextn",
                recipe.layer_type,
                recipe.layer_bits,
                nextn_weights,
                3 * entry.n_embd,
            )
        )
    return lumps


def _attention_counts(entry: CatalogueEntry) -> tuple[int, int]:
    """(matrix elements, F32 elements) of one standard attention block and its norms."""
    q_width = entry.n_head * entry.head_dim_k
    kv_width = entry.n_head_kv * (entry.head_dim_k + entry.head_dim_v)
    out_width = entry.n_head * entry.head_dim_v
    weights = entry.n_embd * (q_width + kv_width + out_width)
    return weights, 2 * entry.n_embd  # attn_norm + ffn_norm


def _mla_counts(entry: CatalogueEntry) -> tuple[int, int]:
    """DeepSeek-style multi-head latent attention (wk_b / wv_b split, as current GGUFs store it)."""
    rope = entry.n_rot
    nope = entry.mla_key_length - rope
    q = entry.n_embd * entry.q_lora_rank + entry.q_lora_rank * entry.n_head * entry.mla_key_length
    kv_a = entry.n_embd * (entry.kv_lora_rank + rope)
    kv_b = entry.n_head * entry.kv_lora_rank * (nope + entry.mla_value_length)
    out = entry.n_head * entry.mla_value_length * entry.n_embd
    norms = 2 * entry.n_embd + entry.q_lora_rank + entry.kv_lora_rank
    return q + kv_a + kv_b + out, norms


def _moe_tensors(entry: CatalogueEntry, recipe: QuantRecipe, prefix: str) -> list[_Lump]:
    expert_type = recipe.expert_type or recipe.layer_type
    up_shape = (entry.n_embd, entry.n_ff_exp, entry.n_expert)
    down_shape = (entry.n_ff_exp, entry.n_embd, entry.n_expert)
    lumps = [
        _f32(f"{prefix}.ffn_gate_inp.weight", (entry.n_embd, entry.n_expert)),
        _quantized(f"{prefix}.ffn_gate_exps.weight", expert_type, up_shape, recipe.expert_bits),
        _quantized(f"{prefix}.ffn_up_exps.weight", expert_type, up_shape, recipe.expert_bits),
        _quantized(f"{prefix}.ffn_down_exps.weight", expert_type, down_shape, recipe.expert_bits),
    ]
    if entry.n_expert_shared:
        shared_weights = 3 * entry.n_embd * entry.n_ff_exp * entry.n_expert_shared
        lumps.append(
            _lump(f"{prefix}.ffn_shexp", recipe.layer_type, recipe.layer_bits, shared_weights, 0)
        )
    return lumps


def _scale_to(lumps: list[_Lump], target_bytes: int) -> list[_Lump]:
    """Scale the quantized lumps by one factor so all bytes sum exactly to ``target_bytes``."""
    fixed = sum(lump.raw_bytes for lump in lumps if not lump.scalable)
    scalable = sum(lump.raw_bytes for lump in lumps if lump.scalable)
    if target_bytes - fixed < scalable / 2:
        raise ConfigError(
            f"A catalogue file size ({target_bytes} bytes of tensors) is far below what the "
            f"hyperparameters need ({fixed + scalable} bytes).",
            hint="Check size_bytes and the shapes in profiles/models.toml.",
        )
    factor = (target_bytes - fixed) / scalable
    scaled = [
        dataclasses.replace(lump, raw_bytes=math.floor(lump.raw_bytes * factor))
        if lump.scalable
        else lump
        for lump in lumps
    ]
    largest = max(range(len(scaled)), key=lambda i: scaled[i].raw_bytes)
    remainder = target_bytes - sum(lump.raw_bytes for lump in scaled)
    scaled[largest] = dataclasses.replace(
        scaled[largest], raw_bytes=scaled[largest].raw_bytes + remainder
    )
    return scaled


def _place(lumps: list[_Lump]) -> tuple[TensorInfo, ...]:
    tensors = []
    offset = 0
    for lump in lumps:
        ggml_type = gguf.GGMLQuantizationType[lump.type_name].value
        tensors.append(
            TensorInfo(lump.name, ggml_type, lump.type_name, lump.shape, lump.raw_bytes, offset)
        )
        offset += lump.raw_bytes
    return tuple(tensors)


# --- the ModelInfo --------------------------------------------------------------------------


def _build_model_info(
    entry: CatalogueEntry, quant_file: QuantFile, tensors: tuple[TensorInfo, ...]
) -> ModelInfo:
    return ModelInfo(
        source=f"catalogue:{entry.slug}:{quant_file.quant}",
        architecture=entry.architecture,
        name=entry.display_name,
        file_type=quant_file.quant,
        file_bytes=quant_file.size_bytes,
        n_files=quant_file.n_files,
        n_params=sum(t.n_elements for t in tensors),
        context_length=entry.context_length,
        n_layer=entry.n_layer,
        n_embd=entry.n_embd,
        n_ff=entry.n_ff,
        n_vocab=entry.n_vocab,
        n_head=(entry.n_head,) * entry.n_layer,
        n_head_kv=(entry.n_head_kv,) * entry.n_layer,
        head_dim_k=entry.head_dim_k,
        head_dim_v=entry.head_dim_v,
        n_swa=entry.n_swa,
        swa_layers=entry.swa_layers(),
        kv_lora_rank=entry.kv_lora_rank,
        n_rot=entry.n_rot,
        n_expert=entry.n_expert,
        n_expert_used=entry.n_expert_used,
        n_expert_shared=entry.n_expert_shared,
        recurrent_layers=(False,) * entry.n_layer,
        ssm_d_conv=0,
        ssm_d_inner=0,
        ssm_d_state=0,
        ssm_n_group=0,
        chat_template=None,
        tokenizer_model=entry.tokenizer_model,
        bos_token_id=None,
        eos_token_id=None,
        tensors=tensors,
        metadata=_metadata(entry, quant_file),
    )


def _metadata(entry: CatalogueEntry, quant_file: QuantFile) -> dict[str, MetadataValue]:
    """GGUF-style keys the planner may look up, plus every catalogue key under ``catalogue.``."""
    arch = entry.architecture
    gguf_keys: dict[str, MetadataValue] = {
        "general.architecture": arch,
        "general.name": entry.display_name,
        f"{arch}.context_length": entry.context_length,
        f"{arch}.block_count": entry.n_layer,
        f"{arch}.embedding_length": entry.n_embd,
        f"{arch}.feed_forward_length": entry.n_ff,
        f"{arch}.attention.head_count": entry.n_head,
        f"{arch}.attention.head_count_kv": entry.n_head_kv,
        f"{arch}.attention.key_length": entry.head_dim_k,
        f"{arch}.attention.value_length": entry.head_dim_v,
        f"{arch}.rope.dimension_count": entry.n_rot,
        f"{arch}.vocab_size": entry.n_vocab,
    }
    gguf_keys.update(_optional_gguf_keys(entry))
    catalogue_keys = {
        f"catalogue.{name}": value
        for name, value in dataclasses.asdict(entry).items()
        if name != "files"
    }
    file_keys = {
        f"catalogue.file.{name}": value for name, value in dataclasses.asdict(quant_file).items()
    }
    return {**gguf_keys, **_as_metadata(catalogue_keys), **_as_metadata(file_keys)}


def _optional_gguf_keys(entry: CatalogueEntry) -> dict[str, MetadataValue]:
    arch = entry.architecture
    candidates: dict[str, int] = {
        f"{arch}.attention.sliding_window": entry.n_swa,
        f"{arch}.attention.q_lora_rank": entry.q_lora_rank,
        f"{arch}.attention.kv_lora_rank": entry.kv_lora_rank,
        f"{arch}.attention.key_length_mla": entry.mla_key_length,
        f"{arch}.attention.value_length_mla": entry.mla_value_length,
        f"{arch}.expert_count": entry.n_expert,
        f"{arch}.expert_used_count": entry.n_expert_used,
        f"{arch}.expert_shared_count": entry.n_expert_shared,
        f"{arch}.expert_feed_forward_length": entry.n_ff_exp,
        f"{arch}.leading_dense_block_count": entry.n_layer_dense_lead,
        f"{arch}.nextn_predict_layers": entry.n_layer_nextn,
    }
    return {key: value for key, value in candidates.items() if value}


def _as_metadata(values: Mapping[str, object]) -> dict[str, MetadataValue]:
    converted: dict[str, MetadataValue] = {}
    for key, value in values.items():
        converted[key] = tuple(value) if isinstance(value, list | tuple) else value  # type: ignore[assignment]
    return converted
