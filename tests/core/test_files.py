"""core.files: host-side reads and writes of workspace files refuse links, FIFOs, devices and
oversize files, and never block."""

import os

import pytest

from benchmax_gym.core.files import WorkspaceFileError, read_workspace_file, unchanged, write_workspace_file


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "ok.bin").write_bytes(b"data")
    (root / "sub").mkdir()
    (root / "sub" / "ok.bin").write_bytes(b"nested")
    (tmp_path / "outside.bin").write_bytes(b"secret")
    return root


def refused(ws, name, code="unsafe_file", max_bytes=100):
    with pytest.raises(WorkspaceFileError) as caught:
        read_workspace_file(ws, name, max_bytes)
    assert caught.value.code == code, caught.value
    return str(caught.value)


def test_regular_files_are_read_and_written(ws):
    assert read_workspace_file(ws, "sub/ok.bin", 100)[0] == b"nested"
    data, version = read_workspace_file(ws, "ok.bin", 100)
    assert data == b"data" and unchanged(ws, "ok.bin", version)
    new_version = write_workspace_file(ws, "ok.bin", b"changed")
    assert (ws / "ok.bin").read_bytes() == b"changed" and not unchanged(ws, "ok.bin", version)
    assert unchanged(ws, "ok.bin", new_version)


def test_links_fifos_devices_and_escapes_are_refused(ws):
    os.symlink(ws.parent / "outside.bin", ws / "abs")
    os.symlink("../outside.bin", ws / "rel")
    os.symlink(ws.parent, ws / "dirlink")
    os.symlink("/dev/zero", ws / "zero")
    os.link(ws.parent / "outside.bin", ws / "hard")
    os.mkfifo(ws / "fifo")
    for name in ("abs", "rel", "dirlink/outside.bin", "zero", "hard", "fifo", "sub", "../outside.bin", "/etc/passwd"):
        refused(ws, name)
    assert refused(ws, "missing", "file_missing")
    assert "over the limit" in refused(ws, "ok.bin", "file_too_large", max_bytes=3)
    for name in ("abs", "hard", "fifo"):
        with pytest.raises(WorkspaceFileError):
            write_workspace_file(ws, name, b"pwned")
    assert (ws.parent / "outside.bin").read_bytes() == b"secret"
    assert not unchanged(ws, "abs", (0, 0, 0, 0))
