"""Fixtures of the panel tests."""
import pytest


@pytest.fixture
def cancel_a_run(monkeypatch):
    """``cancel_a_run(panel)``: the panel's run button pressed with Cancel pressed as the run starts; the page
    must say the runtime stopped its worker processes, beside the button, and keep no run."""
    from workbench.ui.base import RunHandle

    def cancel_at_once(self, done, total):
        self.cancelled.set()

    def cancel(panel) -> None:
        with monkeypatch.context() as m:
            m.setattr(RunHandle, "progress", cancel_at_once)
            panel.runner.button.click()
        assert "cancelled: its worker processes were stopped" in panel.run_info.value
        assert panel.runner.message.value == "" and len(panel.runs) == 0
        assert "cancelled" in panel.runner.status.value
    return cancel
