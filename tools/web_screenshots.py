"""Screenshots of the web page for the README (docs/web-*.png), from a real ``homelab serve``.

    PYTHONPATH=$PWD .venv/bin/python tools/web_screenshots.py

Serves the shipped trained demo model and the gemma3 vision demo with a fresh API key,
chats in Debian's Chromium (headless, via Playwright), then shoots the chat and the dashboard
at a desktop width (light) and a phone width (dark).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

from homelab.server.auth import add_key

DOCS = Path(__file__).resolve().parents[1] / "docs"
SIZES = {"phone": ((390, 844), "dark"), "desktop": ((1280, 800), "light")}
QUESTIONS = ("What does the json module do?", "And the `pathlib` module?")


def serve(home: Path, keys: Path) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "homelab.cli", "serve", "--json", "--port", "0"]
    command += ["--models", "demo:trained,demo:vision-gemma3", "--api-key-file", str(keys)]
    command += ["--ctx", "2048", "--parallel", "2", "--keep-alive", "-1"]
    env = {**os.environ, "HOMELAB_HOME": str(home)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, json.loads(process.stdout.readline())["base_url"].removesuffix("/v1")


def chat(page: Page, url: str, key: str) -> None:
    page.goto(url + "/")
    page.fill("#key-input", key)
    page.click("#sign-in-form button[type=submit]")
    page.wait_for_selector("#chat-view:not([hidden])")
    page.select_option("#model-picker", "demo:trained")
    page.click(".settings summary")
    page.fill("#max-tokens", "60")
    page.click(".settings summary")
    for question in QUESTIONS:
        page.fill("#prompt", question)
        page.press("#prompt", "Enter")
        page.wait_for_function("() => document.getElementById('stop').hidden", timeout=120_000)


def shoot(page: Page, name: str) -> None:
    page.click("#tab-chat")
    page.wait_for_timeout(300)
    page.screenshot(path=str(DOCS / f"web-chat-{name}.png"))
    page.click("#tab-dashboard")
    page.locator("#models-table td", has_text="loaded").first.wait_for()
    page.wait_for_timeout(4000)  # a few points of the tok/s line
    page.screenshot(path=str(DOCS / f"web-dashboard-{name}.png"), full_page=True)


def main() -> None:
    DOCS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder)
        key = add_key(home / "keys.toml", "alice", admin=True)
        process, url = serve(home, home / "keys.toml")
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path="/usr/bin/chromium")
                for name, ((width, height), scheme) in SIZES.items():
                    context = browser.new_context(
                        viewport={"width": width, "height": height}, color_scheme=scheme
                    )
                    page = context.new_page()
                    chat(page, url, key)
                    shoot(page, name)
                    context.close()
                browser.close()
        finally:
            process.terminate()
            process.wait(30)


if __name__ == "__main__":
    main()
