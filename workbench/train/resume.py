"""A training run's progress on disk, so a run stopped mid-way (the server stopped, the machine restarted)
resumes at its last saved step instead of from scratch, and ends bit for bit where an unbroken run ends.

What is saved: the model's tensors, the current phase's optimizer, the step reached in which phase, each
finished phase's losses, the torch and NumPy generators, where the batch iterator is in its epoch, and
whatever the caller computed between phases (``extras``). A save is written to a temporary file and
renamed, so a kill during a save leaves the previous one. The file names the run's key (every input of the
training); a file for other settings is ignored and replaced.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from workbench.cache import atomic_path

SAVE_EVERY_S = 60.0


def progress_path(model_dir: Path) -> Path:
    """Where the training of the model that will be saved at ``model_dir`` keeps its progress (beside it)."""
    model_dir = Path(model_dir)
    return model_dir.with_name(model_dir.name + ".progress.pt")


class TrainingProgress:
    """The progress file of one training run (``path``; None keeps nothing), bound to what it restores."""

    def __init__(self, path: Path | None, key: str, phases: list[str], model: torch.nn.Module, rng, batches,
                 every_s: float | None = None):
        self.path = Path(path) if path is not None else None
        self.key, self.phases = key, phases
        self.every_s = SAVE_EVERY_S if every_s is None else every_s
        self.model, self.rng, self.batches = model, rng, batches
        self.losses: dict[str, list[float]] = {}          # each phase's losses, finished or not
        self.extras: dict = {}
        self.phase, self.step = "", 0                     # where the saved state is
        self._saved_at = time.monotonic()
        self._optimizer_state = None
        saved = self._read()
        if saved is not None:
            self._restore(saved)

    def _read(self) -> dict | None:
        if self.path is None or not self.path.exists():
            return None
        try:
            saved = torch.load(self.path, map_location="cpu", weights_only=False)
        except Exception:                                  # a damaged file: start again
            return None
        return saved if isinstance(saved, dict) and saved.get("key") == self.key else None

    def _restore(self, saved: dict) -> None:
        self.model.load_state_dict(saved["model"])
        torch.set_rng_state(saved["torch_rng"])
        self.rng.bit_generator.state = saved["numpy_rng"]
        self.batches.restore(saved["batches"])
        self.losses, self.extras = saved["losses"], saved["extras"]
        self.phase, self.step = saved["phase"], saved["step"]
        self._optimizer_state = saved["optimizer"]

    def start(self, phase: str, optimizer: torch.optim.Optimizer) -> int | None:
        """The step ``phase`` starts at: 0, the saved step (its optimizer restored), or None when a later
        phase was saved (this one is over; its losses are in :attr:`losses`)."""
        order = self.phases.index
        if not self.phase or order(phase) > order(self.phase):
            return 0
        if order(phase) < order(self.phase):
            return None
        optimizer.load_state_dict(self._optimizer_state)
        return self.step

    def due(self, done: int, total: int) -> bool:
        """Whether to save after ``done`` of ``total`` steps: at the phase's end, or ``every_s`` after the last."""
        return self.path is not None and (done == total or time.monotonic() - self._saved_at >= self.every_s)

    def save(self, phase: str, step: int, optimizer: torch.optim.Optimizer) -> None:
        """Keep the run as it is after ``step`` steps of ``phase``."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        state = {"key": self.key, "phase": phase, "step": step, "model": self.model.state_dict(),
                 "optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                 "numpy_rng": self.rng.bit_generator.state, "batches": self.batches.state(),
                 "losses": self.losses, "extras": self.extras}
        with atomic_path(self.path) as tmp:
            torch.save(state, tmp)
        self.phase, self.step, self._saved_at = phase, step, time.monotonic()

