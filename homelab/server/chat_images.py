"""Images in a chat, between the dialects' common form and the engine.

A message's ``content`` may be a list of parts (``{"type": "text", "text": ...}`` and
``{"type": "image", "image": DecodedImage}``, in order; the dialects' validators make them).
Like llama-server, the chat template renders text: :func:`with_markers` turns each image part
into the projector's marker (``Engine.image_marker``) in the message's text and returns the
images in prompt order, and :func:`tokenize_with_images` reads the rendered prompt with them
through mtmd. A model without a projector given an image answers 400 naming the model
(:func:`no_images_here`), before anything is rendered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio.to_thread

from homelab.engine.image_prompt import ImagePrompt
from homelab.errors import ContextLengthError, EngineError
from homelab.images.decoded import DecodedImage
from homelab.server.engine_seam import EngineLike
from homelab.server.errors import ApiError, invalid_request, prompt_too_long


def has_images(messages: Sequence[dict[str, Any]]) -> bool:
    return any(isinstance(message.get("content"), list) for message in messages)


def with_markers(
    messages: Sequence[dict[str, Any]], marker: str
) -> tuple[list[dict[str, Any]], list[DecodedImage]]:
    """The messages with text content only (each image part as ``marker``), and the images
    in the order their markers appear in the rendered prompt."""
    images: list[DecodedImage] = []
    flat: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            flat.append(message)
            continue
        texts: list[str] = []
        for part in content:
            if part["type"] == "image":
                images.append(part["image"])
                texts.append(marker)
            else:
                texts.append(part["text"])
        flat.append({**message, "content": "".join(texts)})
    return flat, images


def no_images_here(model_name: str) -> ApiError:
    return invalid_request(
        f"The model '{model_name}' does not take images: it has no vision projector "
        "(mmproj) loaded. Send text only, or use a vision model.",
        param="messages",
    )


async def tokenize_with_images(
    engine: EngineLike, text: str, images: Sequence[DecodedImage]
) -> ImagePrompt:
    """The rendered prompt and its images as the engine takes them (off the event loop:
    mtmd resizes every image); 400 when it cannot fit or mtmd refuses it."""

    def run() -> ImagePrompt:
        return engine.tokenize_images(text, images, add_bos=True)

    try:
        prompt = await anyio.to_thread.run_sync(run)
    except ContextLengthError as exc:
        raise prompt_too_long(engine.n_ctx_per_slot, exc.message) from None
    except EngineError as exc:
        raise invalid_request(str(exc), param="messages") from exc
    limit = engine.n_ctx_per_slot - 1
    if prompt.n_cells > limit:
        detail = f"the prompt with its images takes {prompt.n_cells} tokens, more than {limit}"
        raise prompt_too_long(engine.n_ctx_per_slot, detail)
    return prompt
