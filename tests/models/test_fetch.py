"""From a name to a running model: a MODEL that is not on this machine is planned from its
remote header (shown first), downloaded with the verified pull (progress on stderr), then run
— or refused, clearly: without --yes and a terminal, offline, with the hub out of reach, or
when the plan does not fit and --force was not given. Real llama.cpp, the hub stand-in."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_hub import FakeHub

from homelab.cli import main
from homelab.units import format_size

RUN = ("--prompt", "hello", "--max-tokens", "3", "--threads", "1", "--ctx", "256")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def downloaded(hf_home: Path) -> list[str]:
    return sorted(p.name for p in hf_home.rglob("*.gguf"))


class Terminal(io.StringIO):
    """stdin as a terminal where the user types ``answer``."""

    def isatty(self) -> bool:
        return True


def test_plan_then_progress_then_the_answer_with_yes(
    hub_repo: str,
    fake_hub: FakeHub,
    hub_env: Path,
    demo_model: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    size = format_size(demo_model("llama", "tiny", "Q4_0").stat().st_size)
    code, out, err = cli(capsys, "run", f"{hub_repo}:Q4_0", *RUN, "--yes")
    assert code == 0, err
    offer = err.index(f"{hub_repo}:Q4_0 is not on this machine: {hub_repo}:Q4_0,")
    plan = err.index("plan from its remote header, for ", offer)
    assert err[plan:].split("\n")[0].split(": ", 1)[1].startswith("fits · ")
    assert " ctx × 1 slot · KV " in err
    progress = err.index("Tiny-Q4_0.gguf:", plan)  # the bar, named after the file
    assert "B/s" in err[progress : progress + 100]
    done = err.index(f"{hub_repo}:Q4_0: {size} downloaded and verified -> ", progress)
    answer = err.index("TTFT", done)  # the run's stats line comes last
    assert offer < plan < progress < done < answer and "decode 3 tok" in err[answer - 80 :]
    assert out.endswith("\n") and len(out) > 1
    assert downloaded(hub_env) == ["Tiny-Q4_0.gguf"]
    # now it is here: no question, no hub request
    fake_hub.clear_log()
    code, _, err = cli(capsys, "run", f"{hub_repo}:Q4_0", *RUN)
    assert code == 0, err
    assert "not on this machine" not in err and fake_hub.requests() == []


def test_without_a_quant_the_planner_picks_one_from_the_remote_headers(
    hub_repo: str, hub_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from homelab.models.ref import resolve
    from homelab.planner.plan import plan_model
    from homelab.planner.search import PlanRequest

    variants = resolve(hub_repo).variants()  # the remote headers, planned the way run does
    expected = plan_model(variants, None, PlanRequest(ctx=256), verify=False).settings.quant
    code, out, err = cli(capsys, "run", hub_repo, *RUN, "--yes", "--json")
    assert code == 0, err
    assert f"the planner picks {hub_repo}:{expected}," in err
    document = json.loads(out)
    assert Path(document["load"]["path"]).name == f"Tiny-{expected}.gguf"
    assert document["load"]["settings"]["quant"] == expected
    assert downloaded(hub_env) == [f"Tiny-{expected}.gguf"]


def test_without_yes_and_without_a_terminal_it_refuses_after_the_plan(
    hub_repo: str, hub_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "run", f"{hub_repo}:Q4_0", "--prompt", "hi")
    assert code == 1 and out == ""
    assert err.index("plan from its remote header") < err.index("Pass --yes")
    assert "not downloaded yet, and there is no terminal to ask" in err
    assert f"homelab pull {hub_repo}:Q4_0" in err
    assert downloaded(hub_env) == []


@pytest.mark.parametrize(("answer", "code"), [("y\n", 0), ("n\n", 1), ("", 1)])
def test_on_a_terminal_it_asks(
    hub_repo: str,
    hub_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    answer: str,
    code: int,
) -> None:
    monkeypatch.setattr("sys.stdin", Terminal(answer))
    got, _, err = cli(capsys, "run", f"{hub_repo}:Q4_0", *RUN)
    assert got == code, err
    assert "Download it now? [y/N]" in err
    if code == 0:
        assert downloaded(hub_env) == ["Tiny-Q4_0.gguf"]
    else:
        assert "the download of homelab-test/Tiny-GGUF:Q4_0 was declined" in err
        assert downloaded(hub_env) == []


def test_offline_it_refuses_at_once(
    hub_repo: str,
    fake_hub: FakeHub,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = cli(capsys, "run", f"{hub_repo}:Q4_0", *RUN, "--yes", "--json")
    assert code == 1 and out == ""
    error = json.loads(err)["error"]
    assert error["type"] == "DownloadRefused"
    assert "not downloaded yet, and HF_HUB_OFFLINE is set" in error["message"]
    assert "homelab models" in error["message"]
    assert fake_hub.requests() == []


def test_without_a_network_it_says_so(
    hub_repo: str,
    hub_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:  # a port nothing listens on: connection refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    code, out, err = cli(capsys, "run", f"{hub_repo}:Q4_0", *RUN, "--yes")
    assert code == 1 and out == ""
    assert "not downloaded yet, and the hub cannot be reached to download it" in err
    assert "Check the network" in err and "HF_HUB_OFFLINE=1" in err
    assert downloaded(hub_env) == []


def test_a_plan_that_does_not_fit_is_refused_unless_forced(
    hub_repo: str, hub_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = ("--ram", "1MiB")
    code, out, err = cli(capsys, "run", f"{hub_repo}:Q4_0", *RUN, "--yes", *small)
    assert code == 1 and out == ""
    assert f"{hub_repo}:Q4_0 (" in err and "does not fit" in err and "--force" in err
    assert downloaded(hub_env) == []
    code, out, err = cli(capsys, "run", f"{hub_repo}:Q4_0", *RUN, "--yes", "--force", *small)
    assert downloaded(hub_env) == ["Tiny-Q4_0.gguf"]  # forced: downloaded…
    assert code == 1 and "Cannot plan" in err  # …and the run's own plan still says no


def test_bench_refuses_a_download_its_budget_cannot_hold(
    hub_repo: str, hub_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "bench", f"{hub_repo}:Q4_0", "--budget", "1MiB", "--yes")
    assert code == 1 and "does not fit" in err and "1.00 MiB" in err, err
    assert downloaded(hub_env) == []


def test_a_catalogue_name_downloads_the_quant_the_planner_picks_then_runs_offline(
    catalogue_repo: str,
    fake_hub: FakeHub,
    hub_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from homelab.models.ref import resolve
    from homelab.planner.plan import plan_model
    from homelab.planner.search import PlanRequest

    ref = resolve("llama-3.1-8b")  # planned from the catalogue's published shapes
    expected = plan_model(ref.variants(), None, PlanRequest(ctx=256), verify=False).settings.quant
    code, out, err = cli(capsys, "run", "llama-3.1-8b", *RUN, "--yes", "--json")
    assert code == 0, err
    assert (
        f"llama-3.1-8b is not on this machine: the planner picks {catalogue_repo}:{expected}"
        in (err)
    )
    path = Path(json.loads(out)["load"]["path"])
    assert path.name == f"Meta-Llama-3.1-8B-Instruct-{expected}.gguf"
    assert path.resolve().is_relative_to(hub_env)
    # the downloaded quant is what the name means now, even offline
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub.clear_log()
    code, out, err = cli(capsys, "run", "llama-3.1-8b", *RUN, "--json")
    assert code == 0, err
    assert json.loads(out)["load"]["path"] == str(path) and fake_hub.requests() == []


def test_pull_takes_a_catalogue_name(
    catalogue_repo: str, hub_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "pull", "llama-3.1-8b", "--json")
    assert code == 0, err
    assert f"llama-3.1-8b is {catalogue_repo}; the planner picks" in err
    pulled = json.loads(out)
    assert pulled["repo"] == catalogue_repo and pulled["downloaded_bytes"] > 0


@pytest.mark.parametrize("verb", ["run", "serve", "bench", "quality", "tui"])
def test_every_verb_that_loads_goes_through_the_download_path(
    verb: str,
    hub_repo: str,
    fake_hub: FakeHub,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    extra = {"run": ["--prompt", "hi"], "serve": ["--port", "0"]}.get(verb, [])
    code, out, err = cli(capsys, verb, f"{hub_repo}:Q4_0", *extra)  # no terminal, no --yes
    assert code == 1 and out == "", err
    assert err.index("plan from its remote header") < err.index("Pass --yes"), err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub.clear_log()
    code, out, err = cli(capsys, verb, f"{hub_repo}:Q4_0", "--yes", *extra)
    assert code == 1 and out == "" and "HF_HUB_OFFLINE is set" in err, err
    assert fake_hub.requests() == []
