"""Episode uids on root hosts whose users' subordinate-id blocks fill the first band: useradd
gives each user 65,536 ids from 100,000 (rootless podman or docker need them), so 14 users cover
200,000-999,999 and every sandbox failed with "no sandbox uid is free". Now a second band (above
useradd's pool and systemd's container range, below its foreign range and 2^31) takes over, a host
that differs sets its own with BENCHMAX_SANDBOX_UIDS, and the errors say what to change. Real id
files, real locks, real sandboxes."""

import secrets
import subprocess

import pytest

from benchmax_gym.core import sandbox as sandbox_module
from benchmax_gym.core.sandbox import BUBBLEWRAP, Sandbox, _Pool, isolation_report
from tests.core.test_sandbox_uids_and_sockets import ROOT_ONLY, TAKE_ONE, _python

FIRST_BAND = range(200_000, 1_000_000)
SECOND_BAND = range(1_879_048_192, 2_147_352_576)  # systemd's unused 0x70000000-0x7FFDFFFF
USERS = 14  # blocks of 65,536 from 100,000: the 14th ends at 1,017,503, past the first band


def _host_with_subuid_users(tmp_path, extra_subgid: str = "") -> dict[str, str]:
    """passwd, group, subuid and subgid files of a host where useradd gave 14 users (uids
    1000-1013) a subordinate block each at its defaults; ``extra_subgid`` gives away more."""
    names = [f"user{i}" for i in range(USERS)]
    blocks = "".join(f"{name}:{100_000 + 65_536 * i}:65536\n" for i, name in enumerate(names))
    texts = {
        "passwd": "root:x:0:0:root:/root:/bin/bash\n"
                  + "".join(f"{name}:x:{1000 + i}:{1000 + i}::/home/{name}:/bin/bash\n" for i, name in enumerate(names)),
        "group": "root:x:0:\n" + "".join(f"{name}:x:{1000 + i}:\n" for i, name in enumerate(names)),
        "subuid": blocks,
        "subgid": blocks + extra_subgid,
    }
    files = {}
    for kind, text in texts.items():
        (tmp_path / kind).write_text(text)
        files[kind] = str(tmp_path / kind)
    return files


def _login_defs(tmp_path, sub_uid_max: int = 600_100_000, sub_gid_max: int = 600_100_000) -> str:
    """A login.defs as shadow installs it, with these tops of useradd's subordinate-id pool."""
    path = tmp_path / "login.defs"
    path.write_text("# shadow's defaults\nUID_MIN\t\t\t 1000\nUID_MAX\t\t\t60000\n"
                    f"SUB_UID_MIN\t\t   100000\nSUB_UID_MAX\t\t{sub_uid_max}\nSUB_UID_COUNT\t\t    65536\n"
                    f"SUB_GID_MIN\t\t   100000\nSUB_GID_MAX\t\t{sub_gid_max}\nSUB_GID_COUNT\t\t    65536\n")
    return str(path)


def _fill_first_band(tmp_path, monkeypatch, extra_subgid: str = "", **login_defs) -> dict[str, str]:
    files = _host_with_subuid_users(tmp_path, extra_subgid)
    monkeypatch.setattr(sandbox_module, "ID_FILES", files, raising=False)
    monkeypatch.setattr(sandbox_module, "LOGIN_DEFS", _login_defs(tmp_path, **login_defs), raising=False)
    monkeypatch.delenv("BENCHMAX_SANDBOX_UIDS", raising=False)
    return files


@ROOT_ONLY
def test_fourteen_users_subuid_blocks_leave_episodes_a_uid_of_the_second_band(tmp_path, monkeypatch, bubblewrap):
    """The host's 14 subuid blocks give away all of 200,000-999,999: the episode gets a uid of the
    second band, its code runs as it (uid and gid) and owns what it writes, and doctor shows both
    bands with how many uids each has free."""
    _fill_first_band(tmp_path, monkeypatch)
    assert 100_000 + 65_536 * USERS > FIRST_BAND.stop - 1  # the blocks do cover the first band
    with Sandbox() as box:
        assert box.uid in SECOND_BAND, box.uid
        result = box.run("import os\nopen('mine', 'w').close()\nprint(os.getuid(), os.getgid())")
        assert result.error is None, result.text
        assert result.stdout.split() == [str(box.uid), str(box.uid)], result.text
        assert (box.workspace / "mine").stat().st_uid == box.uid
    line = dict(isolation_report())["sandbox uid"]
    assert f"200000-999999 (0 free), then 1879048192-2147352575 ({len(SECOND_BAND)} free)" in line, line
    assert "BENCHMAX_SANDBOX_UIDS" in line, line


@ROOT_ONLY
def test_the_second_band_starts_above_useradds_pool_and_its_uids_are_held_host_wide(tmp_path, monkeypatch):
    """/etc/login.defs raises useradd's pool (SUB_GID_MAX) to two ids below systemd's foreign
    range: the second band keeps above it, so a block useradd hands out later never meets an open
    episode's uid; those two uids are held against another process, then every one is in use and
    the error names both bands and the variable that sets others."""
    _fill_first_band(tmp_path, monkeypatch, sub_uid_max=1_900_000_000, sub_gid_max=SECOND_BAND.stop - 3)
    last_two = {SECOND_BAND.stop - 2, SECOND_BAND.stop - 1}
    pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)  # no server: the uids are the point
    boxes = []
    try:
        boxes = [Sandbox(pool=pool) for _ in range(2)]
        assert {box.uid for box in boxes} == last_two
        with pytest.raises(OSError, match=r"every sandbox uid \(200000-999999 and 2147352574-2147352575, 2 not "
                                          r"given .*\) is in use; set BENCHMAX_SANDBOX_UIDS="):
            Sandbox(pool=pool)
        held = boxes[0].uid
        other = _python(TAKE_ONE, str(held), str(held + 1), stdout=subprocess.PIPE).communicate(timeout=60)[0]
        assert "is in use" in other, other
    finally:
        for box in boxes:
            box.close()
        pool.shut_down()


@ROOT_ONLY
def test_every_band_given_away_is_an_error_naming_the_bands_the_files_and_the_variable(tmp_path, monkeypatch):
    """Where the host gives away the second band too, the error says which ids were wanted, which
    files gave them away (not /etc/passwd, whose ids are elsewhere) and what to set."""
    files = _fill_first_band(tmp_path, monkeypatch, extra_subgid=f"lxd:{SECOND_BAND.start}:{len(SECOND_BAND)}\n")
    pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)
    try:
        with pytest.raises(OSError) as caught:
            Sandbox(pool=pool)
    finally:
        pool.shut_down()
    message = str(caught.value)
    assert message.startswith(f"no sandbox uid is free: {files['subuid']}, {files['subgid']} give every id of "
                              "200000-999999 and 1879048192-2147352575 "), message
    assert files["passwd"] not in message and "set BENCHMAX_SANDBOX_UIDS=first-last" in message, message


@ROOT_ONLY
def test_benchmax_sandbox_uids_sets_the_bands_tried_in_order(tmp_path, monkeypatch):
    """A host whose ids lie elsewhere names its own bands: episodes get them in order (the
    default bands, though free, are not used) and doctor shows them, said to be set there."""
    _fill_first_band(tmp_path, monkeypatch)
    first = 5_000_000 + 2 * secrets.randbelow(1_000_000)  # uids no other test uses (the lock file is shared)
    second = first + 1
    monkeypatch.setenv("BENCHMAX_SANDBOX_UIDS", f"{first}-{first}, {second}-{second}")
    pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)
    boxes = []
    try:
        boxes = [Sandbox(pool=pool) for _ in range(2)]
        assert [box.uid for box in boxes] == [first, second]
        with pytest.raises(OSError, match=f"every sandbox uid \\({first}-{first} and {second}-{second}, 2 not given"):
            Sandbox(pool=pool)
        line = dict(isolation_report())["sandbox uid"]
        assert f"from {first}-{first} (1 free), then {second}-{second} (1 free)" in line, line
        assert "set by BENCHMAX_SANDBOX_UIDS" in line, line
    finally:
        for box in boxes:
            box.close()
        pool.shut_down()


@ROOT_ONLY
@pytest.mark.parametrize("spec, why", [
    ("1879048192", "is not a band first-last"),
    ("2000-1000", "is not a band first-last"),
    ("5000-6000,", "is not a band first-last"),
    ("0-65535", "starts below 1000: uid 0 is root"),
    ("999-5000", "starts below 1000"),
    ("2147483000-2147484000", "goes past 2147483647"),
])
def test_a_malformed_benchmax_sandbox_uids_is_refused_naming_it(tmp_path, monkeypatch, spec, why):
    """A band that is not first-last, reaches root's and the system's ids, or goes past 2^31 is
    refused with the variable and its value named, not read as some other band; doctor says so."""
    _fill_first_band(tmp_path, monkeypatch)
    monkeypatch.setenv("BENCHMAX_SANDBOX_UIDS", spec)
    pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)
    try:
        with pytest.raises(ValueError, match=f"^BENCHMAX_SANDBOX_UIDS='{spec}': .*{why}"):
            Sandbox(pool=pool)
    finally:
        pool.shut_down()
    line = dict(isolation_report())["sandbox uid"]
    assert line.startswith(f"none can be picked: BENCHMAX_SANDBOX_UIDS='{spec}'"), line
