"""What ``homelab serve`` loads for embeddings: an embedding model alone, a generative model
with ``--embeddings mean`` (planned with the embeddings context's bytes set aside)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai

from homelab.engine.embeddings import EmbeddingModelEngine, EmbeddingOptions
from homelab.engine.engine import Engine
from homelab.gguf.reader import read_model
from homelab.models.embeddings import load_serving_engine, planning_hardware
from homelab.models.launch import plan_file
from homelab.models.ref import resolve
from homelab.planner.budget import resolve_hardware
from homelab.planner.embeddings import embedding_memory
from homelab.planner.search import PlanRequest


def test_an_embedding_model_is_served_alone() -> None:
    ref = resolve("demo:bert")
    plan = plan_file(ref, PlanRequest(ctx=512))
    engine = load_serving_engine(ref, plan)
    try:
        assert isinstance(engine, EmbeddingModelEngine)
        assert engine.embedder is not None and engine.embedder.pooling == "mean"
    finally:
        engine.close()


def test_embeddings_beside_a_generative_model_are_planned_for(
    demo_model: Callable[..., Path],
) -> None:
    path = demo_model("llama")
    hardware = resolve_hardware(ram_bytes=4 * 1024**3)
    reserved = planning_hardware(path, hardware, "mean")
    options = EmbeddingOptions(pooling="mean")
    wanted = embedding_memory(read_model(path), options.max_input_tokens, options.n_seq)
    before, after = hardware.devices[-1], reserved.devices[-1]  # the last GPU, or the host
    assert before.budget_bytes - after.budget_bytes == wanted.total_bytes > 0
    assert planning_hardware(path, hardware, None) is hardware
    ref = resolve(str(path))
    engine = load_serving_engine(
        ref, plan_file(ref, PlanRequest(ctx=512, parallel=1)), None, "mean"
    )
    try:
        assert isinstance(engine, Engine) and engine.embedder.pooling == "mean"
    finally:
        engine.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _health(port: int) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health").status_code
    except httpx.TransportError:
        return None


def test_serve_with_embeddings_flag_answers_chat_and_embeddings(
    demo_model: Callable[..., Path], tmp_path: Path
) -> None:
    port = _free_port()
    command = [sys.executable, "-m", "homelab.cli", "serve", str(demo_model("llama")), "--json"]
    command += ["--port", str(port), "--model-id", "demo", "--ctx", "512", "--parallel", "1"]
    command += ["--threads", "1", "--embeddings", "mean"]
    env = {**os.environ, "HOMELAB_HOME": str(tmp_path / "home")}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert process.stdout is not None
        started = json.loads(process.stdout.readline())
        deadline = time.monotonic() + 60
        while _health(port) != 200:
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        with openai.OpenAI(base_url=started["base_url"], api_key="unused", max_retries=0) as sdk:
            vectors = sdk.embeddings.create(model="demo", input=["a", "b"]).data
            reply = sdk.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        assert len(vectors) == 2 and len(vectors[0].embedding) == 256
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=90)
    assert process.returncode == 130, stderr
