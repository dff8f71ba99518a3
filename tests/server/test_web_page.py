"""The web page at ``/`` in a real browser: Debian's Chromium, headless, driven by Playwright,
against a real ``homelab serve`` process (three generated models, real llama.cpp, an API key).

Without Chromium (or the ``playwright`` package) these tests skip, saying how to install it.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from homelab.server.auth import add_key

CHROMIUM = Path("/usr/bin/chromium")
INSTALL = "apt-get update && apt-get install -y chromium"
MODELS = ("demo:trained", "demo:llama", "demo:vision-gemma3", "demo:reasoning")
GEMMA3_IMAGE_TOKENS = 64  # demo_vision.fixed_image_tokens("gemma3")

try:
    from playwright.sync_api import Browser, Page, Request, sync_playwright
except ImportError:  # the test extra not installed
    sync_playwright = None

pytestmark = pytest.mark.skipif(
    sync_playwright is None or not CHROMIUM.is_file(),
    reason=f"the web page tests need Chromium: {INSTALL} (and pip install '.[test]')",
)


class Served:
    def __init__(self, url: str, key: str) -> None:
        self.url = url  # http://127.0.0.1:PORT
        self.key = key


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("web-home")
    keys = home / "keys.toml"
    key = add_key(keys, "alice", admin=True)
    command = [sys.executable, "-m", "homelab.cli", "serve", "--json", "--port", "0"]
    command += ["--models", ",".join(MODELS), "--api-key-file", str(keys)]
    command += ["--ctx", "2048", "--parallel", "2", "--keep-alive", "-1", "--threads", "2"]
    env = {**os.environ, "HOMELAB_HOME": str(home)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        announced = json.loads(process.stdout.readline())
        yield Served(announced["base_url"].removesuffix("/v1"), key)
    finally:
        process.terminate()
        process.wait(30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert sync_playwright is not None
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield launched
        launched.close()


class Watched:
    """A page, every request it made and every script error it met."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.requests: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda request: self.requests.append(_url(request)))
        page.on("pageerror", lambda error: self.errors.append(str(error)))


def _url(request: Request) -> str:
    return request.url


@pytest.fixture
def watched(browser: Browser) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(30_000)
    yield Watched(context.new_page())
    context.close()


def sign_in(watched: Watched, served: Served) -> Page:
    page = watched.page
    page.goto(served.url + "/")
    page.fill("#key-input", served.key)
    page.click("#sign-in-form button[type=submit]")
    page.wait_for_selector("#chat-view:not([hidden])")
    return page


def settings(page: Page, model: str, max_tokens: int, temperature: float = 0.0) -> None:
    page.select_option("#model-picker", model)
    if not page.is_visible("#max-tokens"):
        page.click(".settings summary")
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#temperature", str(temperature))


def last_answer(page: Page) -> Any:
    return page.locator(".message.assistant").last


def send(page: Page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def only_the_server(watched: Watched, served: Served) -> None:
    elsewhere = [u for u in watched.requests if not u.startswith(served.url + "/")]
    assert not elsewhere, f"the page reached beyond its server: {elsewhere}"
    assert not watched.errors, watched.errors


def test_sign_in_pick_a_model_and_watch_the_answer_stream(watched: Watched, served: Served) -> None:
    page = sign_in(watched, served)
    options = page.locator("#model-picker option").all_inner_texts()
    assert [o.split(" ")[0] for o in options] == list(MODELS)
    settings(page, "demo:llama", max_tokens=100)
    facts = page.locator("#model-facts").inner_text()
    assert facts.startswith("not loaded: it loads on its first message · trained for "), facts
    send(page, "Tell me about the sea.")
    answer = last_answer(page)
    page.wait_for_function(
        "() => document.querySelector('.message.assistant .content').textContent.length > 0"
        " && !document.getElementById('stop').hidden"
    )  # tokens on the page while the answer is still streaming
    streaming = answer.locator(".content").inner_text()
    stats = answer.locator(".stats")
    stats.filter(has_text="tok/s").wait_for(timeout=120_000)
    final = answer.locator(".content").inner_text()
    assert len(final) > len(streaming) > 0
    facts = stats.inner_text()
    assert re.search(r"\d+ prompt tokens · prefix not cached · 100 tokens · TTFT \d+ ms", facts)
    assert page.locator("#model-facts").inner_text().startswith("2,048 tokens of context")
    page.fill("#max-tokens", "8")
    page.click("text=Regenerate")  # the same prompt again: its prefix is in the slot
    stats.filter(has_text="8 tokens").wait_for(timeout=120_000)
    second = stats.inner_text()
    assert re.search(r"\d+ prompt tokens · \d+ cached", second), second
    only_the_server(watched, served)


def test_stop_ends_a_long_answer(watched: Watched, served: Served) -> None:
    page = sign_in(watched, served)
    settings(page, "demo:llama", max_tokens=1800)
    send(page, "Write a very long story.")
    page.wait_for_function(
        "() => document.querySelector('.message.assistant .content').textContent.length > 20"
    )
    page.click("#stop")
    stats = last_answer(page).locator(".stats")
    stats.filter(has_text="stopped").wait_for()
    assert page.is_hidden("#stop") and page.is_enabled("#send")
    stopped = last_answer(page).locator(".content").inner_text()
    page.wait_for_timeout(500)
    assert last_answer(page).locator(".content").inner_text() == stopped
    assert "1800 tokens" not in stats.inner_text()
    page.click("text=Regenerate")  # the stopped answer is asked for again
    page.wait_for_function("() => !document.getElementById('stop').hidden")
    page.click("#stop")
    stats.filter(has_text="stopped").wait_for()
    assert page.locator(".message.assistant").count() == 1
    page.fill("#max-tokens", "4")
    page.locator(".message.user button", has_text="Edit").click()  # edit and resend
    assert page.input_value("#prompt") == "Write a very long story."
    send(page, "A short one, then.")
    stats.filter(has_text="4 tokens").wait_for(timeout=120_000)
    assert page.locator(".message.user").all_inner_texts()[0].startswith("user\nA short one")
    assert page.locator(".message").count() == 2
    only_the_server(watched, served)


def test_reasoning_is_folded_apart_from_the_answer(watched: Watched, served: Served) -> None:
    """The reasoning demo's template opens ``<think>``: what it writes first is reasoning."""
    page = sign_in(watched, served)
    settings(page, "demo:reasoning", max_tokens=12)
    assert "thinking" in page.locator("#model-facts").inner_text()  # known before it loads
    send(page, "Think about the sea.")
    answer = last_answer(page)
    answer.locator(".stats").filter(has_text="tok/s").wait_for(timeout=120_000)
    folded = answer.locator("details.reasoning")
    assert folded.count() == 1 and folded.get_attribute("open") is None
    assert not folded.locator(".markdown").is_visible()
    folded.locator("summary").click()
    assert folded.locator(".markdown").inner_text().strip()
    only_the_server(watched, served)


def png_bytes(width_px: int, height_px: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width_px, height_px), (200, 80, 40)).save(buffer, "PNG")
    return buffer.getvalue()


DROP_IMAGE = """([name, b64]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const transfer = new DataTransfer();
  transfer.items.add(new File([bytes], name, { type: "image/png" }));
  const target = document.querySelector(".chat-main");
  target.dispatchEvent(new DragEvent("drop", { dataTransfer: transfer, bubbles: true }));
}"""

PASTE_IMAGE = """([name, b64]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const transfer = new DataTransfer();
  transfer.items.add(new File([bytes], name, { type: "image/png" }));
  const prompt = document.querySelector("#prompt");
  prompt.dispatchEvent(new ClipboardEvent("paste", { clipboardData: transfer, bubbles: true }));
}"""


def test_images_attached_dropped_and_pasted_reach_the_vision_model(
    watched: Watched, served: Served
) -> None:
    page = sign_in(watched, served)
    settings(page, "demo:vision-gemma3", max_tokens=4)
    assert "vision" in page.locator("#model-facts").inner_text()  # its projector, beside it
    page.set_input_files(
        "#attach", files=[{"name": "a.png", "mimeType": "image/png", "buffer": png_bytes(64, 48)}]
    )
    page.evaluate(DROP_IMAGE, ["b.png", base64.b64encode(png_bytes(40, 40)).decode()])
    page.locator("#attachments img").nth(1).wait_for()
    page.evaluate(PASTE_IMAGE, ["c.png", base64.b64encode(png_bytes(32, 32)).decode()])
    page.locator("#attachments img").nth(2).wait_for()
    send(page, "What is in these pictures?")
    stats = last_answer(page).locator(".stats").filter(has_text="tok/s")
    stats.wait_for(timeout=120_000)
    prompt_tokens = int(stats.inner_text().split(" prompt tokens")[0])
    assert prompt_tokens > 3 * GEMMA3_IMAGE_TOKENS  # the three images went into the prompt
    thumbs = page.locator(".message.user img.thumb")
    assert thumbs.count() == 3
    assert thumbs.first.get_attribute("src", timeout=1000).startswith("data:image/png;base64,")
    only_the_server(watched, served)


def test_edit_regenerate_export_and_import(
    watched: Watched, served: Served, tmp_path: Path
) -> None:
    page = sign_in(watched, served)
    settings(page, "demo:trained", max_tokens=6)
    send(page, "first question")
    last_answer(page).locator(".stats").filter(has_text="tok/s").wait_for()
    page.locator(".message.assistant .footer button", has_text="Regenerate").click()
    page.locator(".message.assistant .stats").filter(has_text="tok/s").wait_for()
    assert page.locator(".message").count() == 2  # the answer replaced, not added
    page.locator(".message.user .footer button", has_text="Edit").click()
    assert page.input_value("#prompt") == "first question"
    send(page, "second question")
    last_answer(page).locator(".stats").filter(has_text="tok/s").wait_for()
    users = page.locator(".message.user")
    assert users.count() == 1 and "second question" in users.first.inner_text()
    with page.expect_download() as download:
        page.click("#export-chats")
    exported = tmp_path / "exported.json"
    download.value.save_as(exported)
    document = json.loads(exported.read_text(encoding="utf-8"))
    (conversation,) = [c for c in document["conversations"] if c["messages"]]
    roles = [(m["role"], m["content"]) for m in conversation["messages"]]
    assert roles[0] == ("user", "second question") and roles[1][0] == "assistant"
    page.locator("#conversation-list button[aria-label^='Delete']").first.click()
    assert page.locator(".message").count() == 0
    page.set_input_files("#import-chats", str(exported))
    page.locator(".message.user", has_text="second question").wait_for()
    assert page.locator(".message").count() == 2
    only_the_server(watched, served)


HOSTILE = (
    "Look: <script>window.pwned = 1</script> and "
    '<img src="x" onerror="window.pwned = 2"> and a [link](javascript:window.pwned=3) '
    "and ![pixel](http://evil.example/pixel.png) and raw "
    '<div onclick="window.pwned = 4"><b>bold</b></div> '
    '<iframe src="http://evil.example/frame"></iframe>\n\n<svg onload="window.pwned=5"></svg>'
)


def hostile_file(tmp_path: Path) -> Path:
    message = {
        "role": "assistant",
        "content": HOSTILE,
        "reasoning": HOSTILE,
        "tool_calls": [{"name": "<img src=x onerror=window.pwned=6>", "arguments": HOSTILE}],
        "images": ["javascript:window.pwned=7", "http://evil.example/x.png"],
    }
    conversation = {"title": "<b>hostile</b>", "model": "demo:trained", "messages": [message]}
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps({"conversations": [conversation]}), encoding="utf-8")
    return path


def test_a_hostile_reply_renders_as_text(watched: Watched, served: Served, tmp_path: Path) -> None:
    page = sign_in(watched, served)
    page.set_input_files("#import-chats", str(hostile_file(tmp_path)))
    answer = last_answer(page)
    answer.wait_for()
    page.click(".reasoning summary")
    page.locator(".markdown a").first.click()  # the javascript: link, now without a target
    page.wait_for_timeout(300)
    shown = answer.locator(".content").inner_text()
    assert "<script>window.pwned = 1</script>" in shown
    assert '<img src="x" onerror="window.pwned = 2">' in shown
    assert "![pixel](http://evil.example/pixel.png)" in shown
    assert "<iframe" in shown and '<div onclick="window.pwned = 4">' in shown
    assert page.evaluate("() => window.pwned") is None  # no script ran
    assert page.locator("#messages script, #messages iframe, #messages svg").count() == 0
    assert page.locator("#messages [onerror], #messages [onclick], #messages img").count() == 0
    assert page.locator("#messages a[href^='javascript']").count() == 0
    assert page.locator("#conversation-list").inner_text().startswith("<b>hostile</b>")
    assert "<img src=x" in answer.locator(".tool-call").inner_text()
    with page.expect_download() as download:
        page.click("#export-chats")
    exported = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
    assert exported["conversations"][0]["messages"][0]["content"] == HOSTILE
    assert exported["conversations"][0]["messages"][0]["images"] == []  # not data: images
    only_the_server(watched, served)  # nothing fetched from evil.example


def test_a_wrong_key_is_refused_in_the_page(watched: Watched, served: Served) -> None:
    page = watched.page
    page.goto(served.url + "/")
    page.fill("#key-input", "hl-not-a-key")
    page.click("#sign-in-form button[type=submit]")
    error = page.locator("#sign-in-error")
    error.filter(has_text="refused").wait_for()
    assert "Incorrect API key" in error.inner_text()
    assert page.is_hidden("#chat-view") and page.is_hidden("#dashboard-view")
    assert page.evaluate("() => localStorage.length + sessionStorage.length") == 0
    assert all("hl-not-a-key" not in url for url in watched.requests)  # never in a URL


def test_the_dashboard_shows_the_loaded_model_and_its_tok_s(
    watched: Watched, served: Served
) -> None:
    page = sign_in(watched, served)
    settings(page, "demo:trained", max_tokens=24)
    send(page, "What does the json module do?")
    last_answer(page).locator(".stats").filter(has_text="tok/s").wait_for(timeout=120_000)
    page.wait_for_function("() => document.getElementById('attach').disabled")  # no projector
    page.click("#tab-dashboard")
    row = page.locator("#models-table tr", has_text="demo:trained")
    row.filter(has_text="loaded").wait_for()
    assert "f16/f16" in row.inner_text() and "2,048 × 2" in row.inner_text()
    assert row.locator("[role=meter]").count() == 1  # memory: allocated of planned
    request = page.locator("#requests-table tbody tr").first
    assert "alice" in request.inner_text() and "/v1/chat/completions" in request.inner_text()
    assert float(request.locator("td").last.inner_text()) > 0  # its tok/s
    assert page.locator("#tenants-table", has_text="alice").count() == 1
    page.wait_for_function("() => document.getElementById('toks-now').textContent.length > 0")
    assert page.locator("#toks-chart").bounding_box() is not None
    row.locator("button", has_text="Unload").click()
    row.filter(has_text="unloaded").wait_for()
    only_the_server(watched, served)


def test_the_page_fits_a_phone(watched: Watched, served: Served) -> None:
    page = sign_in(watched, served)
    page.set_viewport_size({"width": 390, "height": 844})
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 390  # nothing wider than the screen
    assert page.locator("#prompt").bounding_box()["width"] > 300
    page.focus("#prompt")
    page.keyboard.type("first line")
    page.keyboard.press("Shift+Enter")  # a new line, not a message
    page.keyboard.type("second line")
    assert page.input_value("#prompt") == "first line\nsecond line"
    assert page.locator(".message").count() == 0


@pytest.fixture(scope="module")
def keyless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``homelab serve demo:trained`` on loopback with no keys file: it takes requests
    without a key, as every dialect does there."""
    home = tmp_path_factory.mktemp("web-keyless")
    command = [sys.executable, "-m", "homelab.cli", "serve", "demo:trained", "--json"]
    command += ["--port", "0", "--ctx", "1024", "--threads", "2"]
    env = {**os.environ, "HOMELAB_HOME": str(home)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield str(json.loads(process.stdout.readline())["base_url"]).removesuffix("/v1")
    finally:
        process.terminate()
        process.wait(30)


def test_a_keyless_loopback_server_opens_the_chat_without_a_sign_in(
    watched: Watched, keyless: str
) -> None:
    page = watched.page
    page.goto(keyless + "/")
    page.wait_for_selector("#chat-view:not([hidden])")
    assert page.is_hidden("#sign-in") and page.is_hidden("#sign-out")  # no key to forget
    page.wait_for_function("document.querySelector('#model-picker').options.length > 0")
    settings(page, page.input_value("#model-picker"), max_tokens=8)
    send(page, "hello")
    last_answer(page).locator(".stats").filter(has_text="tok/s").wait_for(timeout=60_000)
    assert not watched.errors, watched.errors
    elsewhere = [u for u in watched.requests if not u.startswith(keyless + "/")]
    assert not elsewhere, elsewhere
