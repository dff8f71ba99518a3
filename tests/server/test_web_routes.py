"""The web page's files and its dashboard route over plain HTTP (the browser tests are in
test_web_page.py): served without a key under a strict Content-Security-Policy, nothing from
elsewhere, nothing outside ``web/``; ``/admin/dashboard`` for admins, with the facts drawn."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import httpx
from server_helpers import ADMIN_KEY, MODEL_ID, N_SLOTS, alice_headers

from homelab.server.web_page import WEB_DIR

OWN_FILES = ("index.html", "app.js", "api.js", "chat.js", "dashboard.js", "markdown.js")
OWN_FILES += ("store.js", "style.css")


def test_the_page_is_served_without_a_key_under_a_strict_policy(http: httpx.Client) -> None:
    page = http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy
    assert "connect-src 'self'" in policy and "img-src 'self' data: blob:" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    script = http.get("/web/app.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith(
        "text/javascript"
    )
    assert script.headers["content-security-policy"] == policy


def test_every_file_the_page_loads_is_its_own(http: httpx.Client) -> None:
    """No script, style, font or image from elsewhere, no inline script or style."""
    for name in OWN_FILES:
        text = (WEB_DIR / name).read_text(encoding="utf-8")
        assert not re.search(r"https?://", text), name
    html = (WEB_DIR / "index.html").read_text(encoding="utf-8")
    assert "<style" not in html and " style=" not in html
    assert not re.search(r"\son[a-z]+=", html)  # no inline event handler
    assert re.findall(r"<script[^>]*>", html) == ['<script type="module" src="/web/app.js">']
    for source in re.findall(r'(?:src|href)="([^"]+)"', html):
        if source.startswith("/web/"):
            assert http.get(source).status_code == 200, source
        else:
            assert source == "data:,", source  # the empty favicon: no request at all
    for name in ("vendor/marked.esm.js", "vendor/purify.es.mjs"):
        assert http.get(f"/web/{name}").status_code == 200


def test_nothing_outside_the_web_folder_is_served(http: httpx.Client) -> None:
    outside = "/web/..%2f..%2fbench%2fsample_text.txt"  # a .txt file of the package
    for path in (outside, "/web/%2e%2e/app.py", "/web/vendor/..%2f..%2fapp.py", "/web/x.js"):
        response = http.get(path)
        assert response.status_code == 404, path


def test_the_dashboard_route_gathers_models_tenants_and_requests(http: httpx.Client) -> None:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    assert http.post("/v1/chat/completions", json=body, headers=alice_headers()).is_success
    report = http.get("/admin/dashboard", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert report.status_code == 200, report.text
    doc = report.json()
    assert doc["hardware"]["ram_total_bytes"] > 0 and isinstance(doc["hardware"]["gpus"], list)
    (model,) = doc["models"]
    assert model["model"] == MODEL_ID and model["status"] == "loaded"
    assert model["slots_total"] == N_SLOTS and model["type_k"] == "f16"
    assert model["actual_bytes"] > 0 and model["decode_tok_s"] >= 0
    alice = next(t for t in doc["tenants"] if t["tenant"] == "alice")
    assert alice["requests"] >= 1 and alice["completion_tokens"] >= 1
    latest = doc["recent_requests"][0]
    assert latest["route"] == "/v1/chat/completions" and latest["tenant"] == "alice"
    assert latest["completion_tokens"] >= 1 and latest["completion_tok_s"] > 0
    assert "messages" not in latest  # what was asked is never shown


def test_the_dashboard_names_each_gpu_as_the_planner_does() -> None:
    """A GPU profile stands in for a detected GPU (this machine has none)."""
    from homelab.planner.budget import resolve_hardware
    from homelab.server.dashboard import fleet_gpu_labels, hardware_now
    from homelab.server.fleet import Fleet

    hardware = resolve_hardware(gpu="rtx-4090", ram_bytes=64 * 1024**3)
    fleet = Fleet([], hardware, plan_fn=lambda *_: None, load_fn=lambda *_: None)  # type: ignore[arg-type,return-value]
    assert fleet_gpu_labels(fleet) == {0: "GeForce RTX 4090 (profile rtx-4090)"}
    now = hardware_now({0: "GeForce RTX 4090"})
    assert now["ram_total_bytes"] >= now["ram_available_bytes"] > 0


def test_an_unloaded_models_card_comes_from_its_file(
    demo_model: Callable[..., Path], tmp_path: Path
) -> None:
    from homelab.server.file_facts import file_details

    vision = file_details(demo_model("vision-gemma3"))
    assert vision["supports"]["vision"] and "vision" in vision["capabilities"]
    assert vision["meta"]["n_ctx_train"] > 0
    thinking = file_details(demo_model("reasoning"))
    assert thinking["supports"]["reasoning"] and not thinking["supports"]["vision"]
    assert file_details(tmp_path / "gone.gguf") == {}
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf")
    assert file_details(tmp_path / "bad.gguf") == {}
