"""A worker killed (SIGKILL) mid-generation fails the requests, not the process.

llama.cpp's RPC client aborts the process when a worker goes away; homelab's abort callback
(``homelab.llamacpp.abort``) keeps it alive, the engine over the workers reports itself
failed naming the worker that is gone, every request in flight ends with that error,
``/health`` turns 503 with the reason, and SIGTERM still ends ``homelab serve`` cleanly.
Everything here is real: two ``homelab worker`` processes, ``homelab serve``/``run`` as
subprocesses, the ``openai`` SDK.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from rpc_workers import Worker, free_port

from homelab.gguf.vocab import EOS_ID, IM_END_ID
from homelab.units import GIB

WORKER_BUDGET = str(1 * GIB)
NO_END = {str(EOS_ID): -100, str(IM_END_ID): -100}  # generate until killed, never stop early
HANG_GUARD_S = 120  # only so a broken build fails instead of hanging the suite


@pytest.fixture
def served(
    start_worker: Callable[[], Worker], demo_model: Callable[..., Path]
) -> Iterator[tuple[subprocess.Popen[str], str, Worker, Worker]]:
    first, second = start_worker(), start_worker()
    port = free_port()
    command = [sys.executable, "-m", "homelab.cli", "serve", str(demo_model("llama", "bench"))]
    command += ["--json", "--port", str(port), "--model-id", "demo", "--ctx", "1024"]
    command += ["--parallel", "2", "--rpc", f"{first.endpoint},{second.endpoint}"]
    command += ["--rpc-budget", WORKER_BUDGET]
    server = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    try:
        assert server.stdout is not None
        base_url = json.loads(server.stdout.readline())["base_url"]
        deadline = time.monotonic() + HANG_GUARD_S
        while _get(base_url, "/health")[0] != 200:
            assert time.monotonic() < deadline and server.poll() is None, server.stderr
            time.sleep(0.1)
        yield server, base_url, first, second
    finally:
        if server.poll() is None:
            server.kill()
        server.communicate(timeout=30)


def test_serve_survives_a_killed_worker_and_reports_it(
    served: tuple[subprocess.Popen[str], str, Worker, Worker],
) -> None:
    server, base_url, first, second = served
    with (
        openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as sdk,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        reply = sdk.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert reply.usage is not None and reply.usage.completion_tokens >= 1  # served
        whole = pool.submit(_long_completion, sdk)
        stream = _long_stream(sdk)
        with pytest.raises(openai.APIError) as streamed:
            for index, _chunk in enumerate(stream):
                if index == 3:
                    second.process.kill()
        with pytest.raises(openai.APIStatusError) as collected:
            whole.result(timeout=HANG_GUARD_S)
        lost = f"RPC worker {second.endpoint} lost during generation"
        assert lost in streamed.value.message
        assert collected.value.status_code == 503 and lost in collected.value.message
        assert "restart the worker, then restart homelab serve" in collected.value.message

        with pytest.raises(openai.APIStatusError) as refused:  # new requests: a clear 503
            sdk.completions.create(model="demo", prompt="again", max_tokens=2)
        assert refused.value.status_code == 503 and lost in refused.value.message
        assert refused.value.response.headers.get("retry-after") is None

    status, health = _get(base_url, "/health")
    assert status == 503 and health["status"] == "failed"
    assert second.endpoint in health["reason"] and first.endpoint not in health["reason"]
    assert _get(base_url, "/metrics")[0] == 200
    assert server.poll() is None  # alive: llama.cpp's abort() never came

    server.send_signal(signal.SIGTERM)
    _, stderr = server.communicate(timeout=60)
    assert server.returncode == 0, stderr[-4000:]
    assert "Remote RPC server crashed" in stderr  # llama.cpp's own words, logged


def _long_completion(sdk: openai.OpenAI) -> Any:
    return sdk.completions.create(
        model="demo", prompt="Once upon a time", max_tokens=900, logit_bias=NO_END
    )


def _long_stream(sdk: openai.OpenAI) -> Any:
    return sdk.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "go on"}],
        max_tokens=900,
        stream=True,
        logit_bias=NO_END,
    )


def _get(base_url: str, path: str) -> tuple[int | None, Any]:
    root = base_url.removesuffix("/v1")
    try:
        reply = httpx.get(f"{root}{path}", timeout=10)
    except httpx.TransportError:
        return None, None
    is_json = reply.headers.get("content-type", "").startswith("application/json")
    return reply.status_code, reply.json() if is_json else reply.text


def test_run_with_a_killed_worker_prints_why_and_exits_non_zero(
    start_worker: Callable[[], Worker], demo_model: Callable[..., Path]
) -> None:
    first, second = start_worker(), start_worker()
    command = [sys.executable, "-m", "homelab.cli", "run", str(demo_model("llama", "bench"))]
    command += ["--prompt", "Once upon a time", "--max-tokens", "900", "--ignore-eos"]
    command += ["--ctx", "1024", "--rpc", f"{first.endpoint},{second.endpoint}"]
    command += ["--rpc-budget", WORKER_BUDGET]
    run = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    try:
        assert run.stdout is not None
        assert run.stdout.read(8)  # generating: text is streaming out
        first.process.kill()
        _, stderr = run.communicate(timeout=HANG_GUARD_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate(timeout=30)
    assert run.returncode == 1, stderr[-4000:]  # not SIGABRT (-6) and its core dump
    assert f"generation failed: RPC worker {first.endpoint} lost during generation" in stderr
