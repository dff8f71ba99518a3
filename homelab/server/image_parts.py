"""Images in a request's content, as the three dialects' wire validators decode them.

Each dialect names an image its own way (chat's ``image_url`` part, Anthropic's ``image``
block with a ``source``, Responses' ``input_image``); its validator calls one of
:func:`image_from_url` / :func:`image_from_base64`, which return the decoded pixels in the
common form ``{"type": "image", "image": DecodedImage}`` takes. The limits come from the
pydantic validation context (:func:`image_context`, filled from ``ServerConfig`` by
``app.parse_body``, which runs the validation of every route that takes images off the
event loop): at most ``max_images`` per request (:func:`check_image_count`, counted before any is
decoded), a byte cap checked on the base64 text before it is decoded, a pixel cap per image
and per request, and ``data:`` URLs only unless the server allows fetching ``http(s)`` URLs
(then public addresses only unless allowed, with a size cap and one overall deadline,
no redirects: :mod:`homelab.server.image_fetch`;
the address is checked before the request, so a host that changes its DNS answer in between
could still reach a private one). Local paths and ``file:`` URLs are never
read; at most four images decode at once in the process. Every refusal is a ``ValueError``
whose text says what was wrong and what to do: the validators turn it into the dialect's 400.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
import socket
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from homelab.images.decode import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageLimits,
    ImageRejected,
    decode_image,
)
from homelab.images.decoded import DecodedImage
from homelab.server.image_fetch import fetch_image

DEFAULT_MAX_IMAGES = 16
DEFAULT_URL_TIMEOUT_S = 10.0
CONTEXT_KEY = "homelab.images"
DATA_URL = re.compile(r"^data:(?P<mime>[^;,]*)(?P<params>(?:;[^;,]*)*),", re.IGNORECASE)
# images decoded at once, all requests together: each holds up to max_image_pixels × 4 bytes
# while Pillow works, so many large uploads at once queue here instead of piling up memory
DECODING = threading.BoundedSemaphore(4)
DATA_ONLY_HINT = (
    "send the image inline as a data URL (data:image/png;base64,...); "
    "this server does not fetch URLs (its admin can allow it with --allow-image-urls)"
)


@dataclass(frozen=True)
class ImagePolicy:
    """What a request's images may be (from the server's config)."""

    max_images: int = DEFAULT_MAX_IMAGES
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_request_pixels: int = 4 * DEFAULT_MAX_IMAGE_PIXELS  # all of a request's images
    allow_urls: bool = False  # fetch http(s) image URLs
    allow_private_urls: bool = False  # ... also on loopback, LAN and link-local addresses
    url_timeout_s: float = DEFAULT_URL_TIMEOUT_S

    @property
    def limits(self) -> ImageLimits:
        return ImageLimits(self.max_image_bytes, self.max_image_pixels)


@dataclass
class ImageBudget:
    """What one request's images have used so far, and the images already decoded (by the
    text that named them: the same data URL twice is decoded once)."""

    pixels: int = 0
    decoded: dict[str, DecodedImage] = field(default_factory=dict)


def image_context(
    policy: ImagePolicy, decoded: Mapping[str, DecodedImage] | None = None
) -> dict[str, Any]:
    """The validation context one request is parsed with (``decoded``: images the request
    already decoded, by URL: a Responses request validated again as chat)."""
    return {CONTEXT_KEY: (policy, ImageBudget(decoded=dict(decoded or {})))}


def decoded_images(context: Mapping[str, Any] | None) -> dict[str, DecodedImage]:
    """The images decoded so far under ``context``, by the URL that named them."""
    return _policy(context)[1].decoded


def _policy(context: Mapping[str, Any] | None) -> tuple[ImagePolicy, ImageBudget]:
    found = context.get(CONTEXT_KEY) if context else None
    return found if found is not None else (ImagePolicy(), ImageBudget())


def check_image_count(count: int, context: Mapping[str, Any] | None) -> None:
    policy, _ = _policy(context)
    if count > policy.max_images:
        raise ValueError(
            f"the request carries {count} images, more than the {policy.max_images} this server "
            "accepts in one request; send fewer images"
        )


def image_from_url(url: str, context: Mapping[str, Any] | None) -> DecodedImage:
    """A chat ``image_url`` (or Responses ``image_url``): a data URL, or http(s) if allowed."""
    policy, budget = _policy(context)
    if url in budget.decoded:
        return budget.decoded[url]
    mime, payload = _fetched(url, policy)
    image = _decoded(payload, mime, policy, budget)
    budget.decoded[url] = image
    return image


def image_from_base64(
    data: str, media_type: str | None, context: Mapping[str, Any] | None
) -> DecodedImage:
    """Anthropic's ``base64`` source: the bytes and the type the client named (the same data
    twice in one request is decoded once)."""
    policy, budget = _policy(context)
    if data not in budget.decoded:  # keyed by the text itself (no copy; base64 has no ':')
        budget.decoded[data] = _decoded(_unbase64(data, policy), media_type, policy, budget)
    return budget.decoded[data]


def image_from_remote(url: str, context: Mapping[str, Any] | None) -> DecodedImage:
    """Anthropic's ``url`` source: http(s) only, and only where the server allows it."""
    if url.lower().startswith("data:"):
        raise ValueError("a url source takes an http(s) URL; send data inline as a base64 source")
    return image_from_url(url, context)


def _decoded(
    payload: bytes, mime: str | None, policy: ImagePolicy, budget: ImageBudget
) -> DecodedImage:
    try:
        with DECODING:
            image = decode_image(payload, mime, policy.limits)
    except ImageRejected as exc:
        raise ValueError(str(exc)) from None
    budget.pixels += image.width_px * image.height_px
    if budget.pixels > policy.max_request_pixels:
        raise ValueError(
            f"the request's images hold {budget.pixels} pixels together, more than the "
            f"{policy.max_request_pixels} this server decodes for one request; send fewer or "
            "smaller images"
        )
    return image


def _fetched(url: str, policy: ImagePolicy) -> tuple[str | None, bytes]:
    """(the declared MIME type, the encoded bytes) of a data URL, or of an allowed fetch."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return _data_url(url, policy)
    if scheme in ("http", "https"):
        if not policy.allow_urls:
            raise ValueError(f"image URLs are not fetched by this server: {DATA_ONLY_HINT}")
        check_public(url, policy)
        return fetch_image(url, policy)
    raise ValueError(
        "an image must be a data: URL (local files and other schemes are never read): "
        + DATA_ONLY_HINT
    )


def _data_url(url: str, policy: ImagePolicy) -> tuple[str | None, bytes]:
    match = DATA_URL.match(url[:512])
    if match is None:
        raise ValueError("the data URL is malformed; use data:image/png;base64,<data>")
    params = [p.strip().lower() for p in match["params"].split(";") if p.strip()]
    if "base64" not in params:
        raise ValueError("the data URL must be base64-encoded (data:image/png;base64,<data>)")
    mime = match["mime"].strip().lower() or None
    if mime is not None and not mime.startswith("image/"):
        raise ValueError(f"the data URL's type is {mime!r}, not an image type")
    return mime, _unbase64(url[match.end() :], policy)


def _unbase64(text: str, policy: ImagePolicy) -> bytes:
    """Decoded bytes, the cap checked on the text's length before anything is decoded."""
    decoded_at_most = len(text) // 4 * 3 + 3
    if decoded_at_most - 3 > policy.max_image_bytes:
        raise ValueError(
            f"the image is about {decoded_at_most} bytes, more than the "
            f"{policy.max_image_bytes} this server accepts; send a smaller image"
        )
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the image data is not valid base64") from None


def check_public(url: str, policy: ImagePolicy) -> None:
    """Refuse a URL whose host is (or resolves to) a loopback, private, link-local or reserved
    address, unless the server allows those: a client must not make the server reach what
    only the server can (its own ports, the LAN, a cloud's metadata address)."""
    host = urllib.parse.urlsplit(url).hostname
    if not host:
        raise ValueError("the image URL has no host")
    if policy.allow_private_urls:
        return
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (socket.gaierror, UnicodeError):
        raise ValueError(f"the image URL's host {host!r} does not resolve") from None
    for address in addresses:
        if not ipaddress.ip_address(str(address).split("%", 1)[0]).is_global:
            raise ValueError(
                f"the image URL's host {host!r} is {address}, a local or private address; "
                "this server fetches public addresses only (its admin can allow private ones "
                "with --allow-private-image-urls)"
            )


def count_typed_parts(messages: Any, part_type: str) -> int:
    """How many content parts of ``part_type`` a raw ``messages`` list holds (counted before
    any is decoded: the image limit is checked first)."""
    if not isinstance(messages, list):
        return 0
    return sum(
        1
        for message in messages
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == part_type
    )
