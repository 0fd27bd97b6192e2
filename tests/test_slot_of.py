"""A server file's GPU slot is read from its name in one place (``regen.layout.slots.slot_of``), the
inverse of ``SlotFiles.of``: every slot file names its slot, another file names none."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.layout.slots import SlotFiles, slot_of


def test_every_slot_file_names_its_slot(tmp_path: Path) -> None:
    files = SlotFiles.of(12, tmp_path / "servers", tmp_path / "logs")
    paths = (files.lock, files.lease, files.url, files.realized, files.log, files.progress, files.restarts)
    for path in paths:
        assert slot_of(path) == 12, path
    assert SlotFiles.beside(files.url) == SlotFiles.of(12, files.url.parent, files.url.parent)


@pytest.mark.parametrize("name", ["gpu.url", "gpux.url", "gpu1x.url", "prestart.lock", "cpu3.url"])
def test_another_file_names_no_slot(tmp_path: Path, name: str) -> None:
    assert slot_of(tmp_path / name) is None
    with pytest.raises(ValueError, match=name):
        SlotFiles.beside(tmp_path / name)
