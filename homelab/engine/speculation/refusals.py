"""What cannot speculate: targets that cannot drop rejected tokens, drafts that cannot draft.

Rejected draft tokens are dropped from both caches, so a target whose memory cannot drop a
suffix (recurrent and hybrid models) is refused, as is a sliding-window cache that is trimmed
(``swa_full`` off), and a draft whose vocabulary is not the target's.
"""

from __future__ import annotations

from pathlib import Path

from homelab.engine.speculation.config import SpeculationError
from homelab.llamacpp.vocab import Vocab


def check_target(arch: str, *, recurrent: bool, n_swa: int, swa_full: bool) -> None:
    """Refuse targets whose cache cannot drop rejected draft tokens."""
    if recurrent:
        raise SpeculationError(
            f"speculative decoding needs a target that can drop rejected draft tokens, but "
            f"this {arch} model keeps a recurrent state (Mamba, RWKV and hybrids cannot be "
            "rolled back partially in llama.cpp)",
            hint="Run it without speculation.",
        )
    if n_swa > 0 and not swa_full:
        raise SpeculationError(
            f"speculative decoding cannot roll back this model's trimmed sliding-window cache "
            f"(window {n_swa}): llama.cpp reuses cells the window no longer needs while a "
            "draft is being verified",
            hint="Load it with swa_full on (a full-size sliding-window cache) to speculate.",
        )


def check_draft_model(path: Path, *, recurrent: bool) -> None:
    if recurrent:
        raise SpeculationError(
            f"the draft model {path.name} keeps a recurrent state, which llama.cpp cannot "
            "roll back after a rejected draft",
            hint="Use a transformer draft model.",
        )


VOCAB_SLACK = 128  # padded vocabularies of one family differ by a few unused ids
FULL_COMPARE_LIMIT = 32768  # compare every token text up to this size, a sample above


def check_vocabularies(target: Vocab, draft: Vocab, draft_name: str) -> None:
    """Refuse a draft whose tokens are not the target's (same ids, same texts)."""

    def refuse(problem: str) -> SpeculationError:
        return SpeculationError(
            f"the draft model {draft_name} cannot draft for this target: {problem}",
            hint="Use a draft from the same model family (the same tokenizer).",
        )

    if target.kind != draft.kind:
        raise refuse(f"its tokenizer type is {draft.kind}, the target's is {target.kind}")
    if abs(target.n_tokens - draft.n_tokens) > VOCAB_SLACK:
        raise refuse(f"it has {draft.n_tokens} tokens, the target {target.n_tokens}")
    for name in ("bos", "eos", "adds_bos", "adds_eos"):
        if getattr(target, name) != getattr(draft, name):
            raise refuse(f"{name} is {getattr(draft, name)!r}, the target's is "
                         f"{getattr(target, name)!r}")  # fmt: skip
    for token in _tokens_to_compare(min(target.n_tokens, draft.n_tokens)):
        mine, theirs = (
            target.token_bytes(token, special=True),
            draft.token_bytes(token, special=True),
        )
        if mine != theirs:
            raise refuse(f"token {token} is {theirs!r} in the draft but {mine!r} in the target")


def _tokens_to_compare(n_common: int) -> range | list[int]:
    if n_common <= FULL_COMPARE_LIMIT:
        return range(n_common)
    stride = n_common // 4096
    sample = set(range(0, 1024)) | set(range(n_common - 1024, n_common))
    return sorted(sample | set(range(0, n_common, stride)))
