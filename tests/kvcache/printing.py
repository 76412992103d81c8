"""A subprocess whose merged output the test reads line by line (a served LLM service)."""
import queue
import subprocess
import threading
import time


class Printing:
    """``args`` started with stdout and stderr merged; ``wait_for`` the line that says something happened."""

    def __init__(self, args: list[str], env: dict | None = None):
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def wait_for(self, text: str, timeout: float) -> str:
        """The first line containing ``text``; fails with everything printed when none comes in ``timeout``."""
        seen, end = [], time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            seen.append(line)
            if text in line:
                return line
            if line == "":
                break
        raise AssertionError(f"the server never printed {text!r}; it printed:\n{''.join(seen)}")
