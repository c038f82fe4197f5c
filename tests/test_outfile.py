"""slurm_gpueff.outfile: files written where a person names them never replace an existing one unless asked, and
never go through a symbolic link. Real files and links in a temporary directory; the end-to-end cases (seff-gpu
--html as the ordinary user, hook install) are in test_api.py and test_gpueff_cli.py."""

from __future__ import annotations

import errno
import os

import pytest

from slurm_gpueff import outfile


def test_a_new_file_is_written_with_the_umasks_mode(tmp_path):
    out = tmp_path / "card.html"
    old = os.umask(0o027)
    try:
        outfile.write(str(out), b"<html>")
    finally:
        os.umask(old)
    assert out.read_bytes() == b"<html>" and os.stat(out).st_mode & 0o777 == 0o640
    assert os.listdir(tmp_path) == ["card.html"]  # no temporary file left


def test_the_link_attack_leaves_the_target_untouched(tmp_path):
    """``ln -s target.txt link.html; seff-gpu --html link.html JOBID`` rewrote target.txt."""
    (tmp_path / "target.txt").write_text("precious\n")
    (tmp_path / "link.html").symlink_to("target.txt")
    with pytest.raises(outfile.OutputExists) as info:
        outfile.write(str(tmp_path / "link.html"), b"<html>")
    assert str(info.value) == (f"{tmp_path}/link.html exists (a symbolic link, not followed): not overwritten; "
                               "--force replaces it")
    assert info.value.exit_code == 2
    assert (tmp_path / "target.txt").read_text() == "precious\n" and (tmp_path / "link.html").is_symlink()
    outfile.write(str(tmp_path / "link.html"), b"<html>", force=True)  # the link itself is replaced
    assert not (tmp_path / "link.html").is_symlink() and (tmp_path / "link.html").read_bytes() == b"<html>"
    assert (tmp_path / "target.txt").read_text() == "precious\n"
    assert sorted(os.listdir(tmp_path)) == ["link.html", "target.txt"]


def test_a_dangling_link_is_not_followed_to_create_its_target(tmp_path):
    (tmp_path / "link.html").symlink_to(tmp_path / "made-by-us.txt")
    with pytest.raises(outfile.OutputExists):
        outfile.write(str(tmp_path / "link.html"), b"x")
    assert not (tmp_path / "made-by-us.txt").exists()


def test_an_existing_file_is_refused_and_force_replaces_it(tmp_path):
    out = tmp_path / "card.html"
    out.write_text("old")
    with pytest.raises(outfile.OutputExists, match=r"card.html exists \(a file\): not overwritten; --force"):
        outfile.write(str(out), b"new")
    assert out.read_text() == "old"
    os.link(out, tmp_path / "other-name")  # a hard link to the old file: its contents are not rewritten
    outfile.write(str(out), b"new", force=True)
    assert out.read_text() == "new" and (tmp_path / "other-name").read_text() == "old"


def test_a_directory_is_never_replaced(tmp_path):
    (tmp_path / "d").mkdir()
    for force in (False, True):
        with pytest.raises(outfile.OutputExists, match="is a directory: not replaced"):
            outfile.write(str(tmp_path / "d"), b"x", force=force)
    assert os.listdir(tmp_path / "d") == []


def test_a_name_taken_meanwhile_is_not_replaced(tmp_path, monkeypatch):
    """Between the check and the write another process takes the name (a link to a file of ours): link() then
    fails and nothing is replaced. The race is made by running the check before the name appears."""
    (tmp_path / "target.txt").write_text("precious\n")
    check = outfile.refuse_existing
    calls = []

    def late(path: str, force: bool) -> None:
        check(path, force)
        if not calls:
            calls.append(path)
            os.symlink("target.txt", path)

    monkeypatch.setattr(outfile, "refuse_existing", late)
    with pytest.raises(outfile.OutputExists):
        outfile.write(str(tmp_path / "link.html"), b"<html>")
    assert (tmp_path / "target.txt").read_text() == "precious\n"
    assert sorted(os.listdir(tmp_path)) == ["link.html", "target.txt"]


def test_a_file_system_without_hard_links_still_never_clobbers(tmp_path, monkeypatch):
    """Some file systems (FAT, some network ones) refuse link(); none such is mounted here, so link() is made to
    fail as they do (EPERM). The file is then created under its name with O_EXCL | O_NOFOLLOW."""
    def no_links(src: str, dst: str) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(outfile.os, "link", no_links)
    outfile.write(str(tmp_path / "new.html"), b"<html>")
    assert (tmp_path / "new.html").read_bytes() == b"<html>" and os.listdir(tmp_path) == ["new.html"]


def test_an_unwritable_directory_is_one_line(tmp_path):
    with pytest.raises(outfile.OutputError) as info:
        outfile.write(str(tmp_path / "missing" / "card.html"), b"x")
    assert str(info.value) == f"cannot write {tmp_path}/missing/card.html: No such file or directory"
    assert info.value.exit_code == 1
