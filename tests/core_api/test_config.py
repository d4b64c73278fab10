"""Settings: argument over environment over default, read at call time, bad values named."""

from __future__ import annotations

import pytest

from trash_panda import ArgumentError
from trash_panda.offload import config


def test_default_environment_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRASH_PANDA_LOOKAHEAD", raising=False)
    assert config.setting("lookahead") == 2
    monkeypatch.setenv("TRASH_PANDA_LOOKAHEAD", "0")
    assert config.setting("lookahead") == 0
    assert config.setting("lookahead", 3) == 3


@pytest.mark.parametrize("raw,value", [("1", True), ("on", True), ("YES", True), ("false", False), ("off", False)])
def test_switch_spellings(monkeypatch: pytest.MonkeyPatch, raw: str, value: bool) -> None:
    monkeypatch.setenv("TRASH_PANDA_PROFILE", raw)
    assert config.setting("profile") is value


def test_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "sometimes")
    with pytest.raises(ArgumentError, match="TRASH_PANDA_RAM_IN_MEMORY.*sometimes.*on/off"):
        config.setting("ram_in_memory")
    with pytest.raises(ArgumentError, match="auto, direct, buffered"):
        config.setting("disk_mode", "fast")
    with pytest.raises(ArgumentError, match="lookahead"):
        config.setting("lookahed")


def test_table() -> None:
    assert config.DEFAULTS["lookahead"] == "2"
    assert "TRASH_PANDA_PROFILE" in config.describe()
