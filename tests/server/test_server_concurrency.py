"""Many clients at once: complete, unmixed streams; a leaving client frees its slot without
disturbing the others; a new request never cuts a running stream."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from server_helpers import ALICE_KEY, MODEL_ID

from homelab.engine.engine import Engine
from homelab.server.runner import ServerHandle

NO_END = {"2": -100, "4": -100}  # ban </s> and <|im_end|>: every answer runs to max_tokens
WORDS = ["cache", "token", "layer", "model", "speed", "memory", "context", "quant"]


def prompt(i: int) -> list[dict[str, str]]:
    return [
        {
            "role": "user",
            "content": f"{WORDS[i % 8]} {WORDS[(i * 3) % 8]} number {i} {WORDS[(i * 5) % 8]}",
        }
    ]


async def reference(sdk: openai.AsyncOpenAI, i: int, max_tokens: int) -> str:
    reply = await sdk.chat.completions.create(
        model=MODEL_ID, messages=prompt(i), max_tokens=max_tokens, temperature=0, logit_bias=NO_END
    )
    return reply.choices[0].message.content or ""


async def streamed(sdk: openai.AsyncOpenAI, i: int, max_tokens: int) -> tuple[str, str | None]:
    stream = await sdk.chat.completions.create(
        model=MODEL_ID,
        messages=prompt(i),
        max_tokens=max_tokens,
        temperature=0,
        logit_bias=NO_END,
        stream=True,
    )
    pieces, finish = [], None
    async for chunk in stream:
        pieces.append(chunk.choices[0].delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    return "".join(pieces), finish


async def test_sixteen_streaming_clients_get_their_own_complete_answers(
    server: ServerHandle,
) -> None:
    async with openai.AsyncOpenAI(
        base_url=server.base_url, api_key=ALICE_KEY, max_retries=0, timeout=120
    ) as sdk:
        expected = [await reference(sdk, i, 8) for i in range(16)]
        results = await asyncio.gather(*(streamed(sdk, i, 8) for i in range(16)))
    assert [text for text, _ in results] == expected
    assert {finish for _, finish in results} == {"length"}
    assert len(set(expected)) > 1  # distinct prompts gave distinct answers: mixing would show


async def test_a_client_leaving_cancels_its_generation_only(
    server: ServerHandle, engine: Engine
) -> None:
    cancelled_before = engine.metrics().requests_by_status.get("cancelled", 0)
    async with openai.AsyncOpenAI(
        base_url=server.base_url, api_key=ALICE_KEY, max_retries=0, timeout=120
    ) as sdk:
        expected = [await reference(sdk, i, 24) for i in range(3)]

        async def leaver() -> None:
            stream = await sdk.chat.completions.create(  # 16 x 480 tokens: still running at hang-up
                model=MODEL_ID,
                messages=prompt(99),
                max_tokens=480,
                n=16,
                logit_bias=NO_END,
                stream=True,
            )
            async for _ in stream:
                break  # first chunk, then hang up
            await stream.close()

        results = await asyncio.gather(leaver(), *(streamed(sdk, i, 24) for i in range(3)))
    assert [text for text, _ in results[1:]] == expected
    deadline = time.monotonic() + 5
    while engine.metrics().requests_by_status.get("cancelled", 0) == cancelled_before:
        assert time.monotonic() < deadline, "the engine never cancelled the abandoned request"
        await asyncio.sleep(0.02)
    assert engine.metrics().active_slots == 0 or await _slots_drain(engine)


async def _slots_drain(engine: Engine) -> bool:
    for _ in range(250):
        if engine.metrics().active_slots == 0:
            return True
        await asyncio.sleep(0.02)
    return False


def test_a_new_request_never_cuts_a_running_stream(server: ServerHandle) -> None:
    headers = {"Authorization": f"Bearer {ALICE_KEY}"}
    body = {
        "model": MODEL_ID,
        "messages": prompt(5),
        "max_tokens": 300,
        "temperature": 0,
        "logit_bias": NO_END,
    }
    with httpx.Client(base_url=server.url, timeout=120) as http:
        alone = http.post("/v1/chat/completions", json=body, headers=headers).json()
        expected = alone["choices"][0]["message"]["content"]
        with http.stream(
            "POST", "/v1/chat/completions", json={**body, "stream": True}, headers=headers
        ) as stream:
            lines = stream.iter_lines()
            head = [next(lines) for _ in range(4)]
            interloper = http.post(
                "/v1/chat/completions",
                json={**body, "messages": prompt(6), "max_tokens": 20},
                headers=headers,
            )
            rest = list(lines)
    assert interloper.status_code == 200
    events = [line.removeprefix("data: ") for line in head + rest if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [httpx.Response(200, content=event).json() for event in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_client_leaving_a_non_streamed_request_cancels_it(
    server: ServerHandle, engine: Engine
) -> None:
    cancelled_before = engine.metrics().requests_by_status.get("cancelled", 0)
    body = {
        "model": MODEL_ID,
        "messages": prompt(7),
        "max_tokens": 480,
        "n": 16,
        "logit_bias": NO_END,
    }
    headers = {"Authorization": f"Bearer {ALICE_KEY}"}
    with (
        httpx.Client(base_url=server.url, timeout=0.05) as http,
        pytest.raises(httpx.ReadTimeout),  # hangs up long before 16 x 480 tokens are done
    ):
        http.post("/v1/chat/completions", json=body, headers=headers)
    deadline = time.monotonic() + 10
    while engine.metrics().requests_by_status.get("cancelled", 0) == cancelled_before:
        assert time.monotonic() < deadline, "the engine never cancelled the abandoned request"
        time.sleep(0.02)
