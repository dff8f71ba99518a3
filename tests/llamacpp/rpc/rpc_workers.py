"""Real ``homelab worker`` processes on 127.0.0.1 (CPU devices) for the RPC tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

WORKER_START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Worker:
    def __init__(self, port: int) -> None:
        self.port = port
        self.endpoint = f"127.0.0.1:{port}"
        command = [sys.executable, "-m", "homelab.cli", "worker", "--port", str(port)]
        command += ["--device", "CPU", "--threads", "1"]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        self.banner = self._wait_ready()

    def _wait_ready(self) -> list[str]:
        assert self.process.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Use it with"):
                return lines
        self.stop()
        raise AssertionError(f"worker on {self.port} did not start: {lines} {self.stderr}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return int(self.process.returncode)

    @property
    def stderr(self) -> str:
        if self.process.poll() is None or self.process.stderr is None:
            return ""
        return self.process.stderr.read()
