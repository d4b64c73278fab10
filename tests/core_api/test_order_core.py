"""Order files through the binding: naming, a write/read round trip, ignored files, errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trash_panda import _core
from trash_panda.errors import ArgumentError, OrderError, ReadError, StreamError, TrashPandaError

BLOCKS = ["double_blocks.0.", "double_blocks.1.", "single_blocks.0.", "single_blocks.1."]


def test_the_name_follows_the_checkpoint(tmp_path: Path) -> None:
    assert _core.order_file_path(tmp_path / "model.safetensors") == tmp_path / "model_order.json"
    index = tmp_path / "unet.safetensors.index.json"
    assert _core.order_file_path(str(index)) == tmp_path / "unet_order.json"
    folder = tmp_path / "transformer"
    folder.mkdir()
    assert _core.order_file_path(folder) == folder / "transformer_order.json"
    dest = tmp_path / "orders"
    assert _core.order_file_path(folder, dest) == dest / "transformer_order.json"
    assert _core.ORDER_SUFFIX == "_order.json"


def test_write_then_read_round_trip(tmp_path: Path) -> None:
    checkpoint = tmp_path / "model.safetensors"
    path = _core.order_file_path(checkpoint)
    ran = ["single_blocks.1.", "single_blocks.0.", "double_blocks.0."]
    _core.write_order_file(path, checkpoint, ran)

    content = json.loads(path.read_text())
    assert content == {
        "format": _core.ORDER_FORMAT,
        "version": _core.ORDER_VERSION,
        "checkpoint": "model.safetensors",
        "blocks": ["single_blocks.1", "single_blocks.0", "double_blocks.0"],
    }
    assert [p.name for p in tmp_path.iterdir()] == ["model_order.json"]

    read = _core.read_order_file(path, BLOCKS)
    assert read.usable
    assert read.path == path
    assert read.blocks == ran
    assert read.indices == [3, 2, 0]
    assert read.reason is None and read.detail is None and read.warning() is None
    assert _core.order_to_write(read, ran, BLOCKS) is None
    # A partial pass in another order takes the places of the blocks it ran; the others stay.
    assert _core.order_to_write(read, ran[::-1], BLOCKS) == [
        "double_blocks.0.",
        "single_blocks.0.",
        "single_blocks.1.",
        "double_blocks.1.",
    ]
    assert _core.full_order(read.blocks, BLOCKS) == [3, 2, 0, 1]


def test_an_absent_file_says_nothing(tmp_path: Path) -> None:
    read = _core.read_order_file(tmp_path / "model_order.json", BLOCKS)
    assert not read.usable
    assert read.blocks is None and read.indices is None
    assert read.reason == "absent"
    assert read.warning() is None
    # A partial pass: the block that ran first, then the model's order.
    assert _core.order_to_write(read, ["double_blocks.1"], BLOCKS) == [BLOCKS[1], BLOCKS[0], *BLOCKS[2:]]
    assert _core.order_to_write(read, [], BLOCKS) is None


def test_a_torn_file_is_treated_as_absent(tmp_path: Path) -> None:
    path = tmp_path / "model_order.json"
    _core.write_order_file(path, tmp_path / "model.safetensors", ["double_blocks.1"])
    text = path.read_text()
    path.write_text(text[: len(text) // 2])

    read = _core.read_order_file(path, BLOCKS)
    assert not read.usable
    assert read.reason == "torn"
    warning = read.warning()
    assert warning is not None and str(path) in warning and "replaced" in warning
    assert _core.order_to_write(read, ["double_blocks.1"], BLOCKS) == [BLOCKS[1], BLOCKS[0], *BLOCKS[2:]]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json at all", "not-json"),
        ('{"format": "other", "version": 1, "blocks": []}', "wrong-format"),
        ('{"format": "trash-panda-order", "version": 2, "blocks": []}', "wrong-version"),
        ('{"format": "trash-panda-order", "version": 1}', "malformed"),
    ],
)
def test_a_foreign_file_is_ignored(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "model_order.json"
    path.write_text(text)
    read = _core.read_order_file(path, BLOCKS)
    assert read.reason == reason
    assert read.detail
    assert read.block is None


def test_a_block_the_model_lacks_is_named(tmp_path: Path) -> None:
    path = tmp_path / "model_order.json"
    _core.write_order_file(path, "model.safetensors", ["double_blocks.0", "txt_blocks.2"])
    read = _core.read_order_file(path, BLOCKS)
    assert read.reason == "unknown-block"
    assert read.block == "txt_blocks.2"
    assert "txt_blocks.2" in (read.warning() or "")


def test_an_unwritable_folder_raises_one_typed_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for path in [tmp_path / "missing" / "model_order.json", blocker / "model_order.json"]:
        with pytest.raises(OrderError, match="model_order.json") as caught:
            _core.write_order_file(path, "model.safetensors", ["double_blocks.0"])
        assert isinstance(caught.value, TrashPandaError) and isinstance(caught.value, OSError)
        assert not isinstance(caught.value, StreamError)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_a_read_only_folder_raises_the_same_error(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.geteuid() != 0:
            with pytest.raises(OrderError):
                _core.write_order_file(folder / "m_order.json", "m.safetensors", ["a"])
            return
        # Root writes anywhere by its capabilities: the write runs in a child without them.
        setpriv = shutil.which("setpriv")
        assert setpriv is not None, "setpriv (util-linux) drops root's file capabilities for this test"
        script = (
            "import sys\n"
            "from trash_panda import _core\n"
            "from trash_panda.errors import OrderError\n"
            "try:\n"
            "    _core.write_order_file(sys.argv[1], 'm.safetensors', ['a'])\n"
            "except OrderError as e:\n"
            "    print('OrderError', e)\n"
        )
        caps = "-dac_override,-dac_read_search,-fowner"
        child = subprocess.run(
            [setpriv, f"--bounding-set={caps}", sys.executable, "-c", script, str(folder / "m_order.json")],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert child.stdout.startswith("OrderError") and "m_order.json" in child.stdout, child
        assert not (folder / "m_order.json").exists()
    finally:
        folder.chmod(0o755)


def test_an_unreadable_file_is_a_read_error(tmp_path: Path) -> None:
    path = tmp_path / "model_order.json"
    path.mkdir()
    with pytest.raises(ReadError, match="model_order.json"):
        _core.read_order_file(path, BLOCKS)


def test_order_argument_errors_name_the_block() -> None:
    with pytest.raises(ArgumentError) as caught:
        _core.full_order(["txtfusion.layerwise_blocks.0"], ["a.", "b.", "c."])
    assert str(caught.value) == (
        "order names txtfusion.layerwise_blocks.0, which is not a block of the model (blocks: a., b., c.)"
    )
    with pytest.raises(ArgumentError, match="twice"):
        _core.full_order(["a", "a."], ["a.", "b."])
    assert _core.full_order(["c"], ["a.", "b.", "c."]) == [2, 0, 1]
