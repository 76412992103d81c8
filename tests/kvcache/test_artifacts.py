import json

from workbench.cache import ENV_VAR
from workbench.kvcache import artifacts


def test_replays_of_another_format_or_settings_are_made_again(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    path = artifacts.replays_path("quick")
    path.parent.mkdir(parents=True)
    current = {"format": artifacts.REPLAYS_FORMAT, "settings": artifacts.DEFAULTS["quick"],
               "replays": {m: {} for m in artifacts.METHODS}}
    path.write_text(json.dumps(current))
    assert artifacts.replays_ready("quick")
    for stale in ({**current, "format": artifacts.REPLAYS_FORMAT - 1},
                  {k: v for k, v in current.items() if k != "format"},
                  {**current, "settings": {**artifacts.DEFAULTS["quick"], "device": "mi14"}},
                  {**current, "replays": {"llms": {}}}):
        path.write_text(json.dumps(stale))
        assert not artifacts.replays_ready("quick")
    path.write_text("{not json")
    assert not artifacts.replays_ready("quick")


def test_the_full_replays_generate_no_more_than_the_page_shows():
    """The page, its figures and the notebooks show switching, never a call's answer: one generated token a
    call is all the prepared replays need (each more is a forward pass per call under five methods)."""
    from pathlib import Path

    assert artifacts.DEFAULTS["full"]["max_new_tokens"] == 1
    root = Path(artifacts.__file__).resolve().parents[1]
    for view in (root / "ui" / "kvcache.py", root / "viz" / "kvcache.py"):
        assert ".output" not in view.read_text(), f"{view} shows answers: the replays need more tokens"
