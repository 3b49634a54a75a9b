"""A GGUF file as a model: imported once into a Hugging Face folder that transformers and rhymerl's own
model read with the same numbers as transformers reading the GGUF itself, and refused clearly when it
is not one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_gguf import write_tiny_gguf

from rhymerl.workers.model import gguf_import
from rhymerl.workers.model.folder import ModelError, model_dir
from rhymerl.workers.model.gguf_import import import_gguf
from rhymerl.workers.model.tokenizer import load_tokenizer
from rhymerl.workers.model.transformer import load_model

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture(scope="module")
def imported(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "model"
    import_gguf(tiny_gguf, out)
    return out


def _chat_ids(folder: Path) -> torch.Tensor:
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids: torch.Tensor = tok.apply_chat_template([{"role": "user", "content": "What is 17 + 25?"}],
                                                add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)["input_ids"]
    return ids


def test_an_imported_gguf_gives_the_logits_transformers_gives_reading_the_gguf(tiny_gguf: Path,
                                                                              imported: Path) -> None:
    direct = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name,
                                                               dtype=torch.float32)
    folder = transformers.AutoModelForCausalLM.from_pretrained(str(imported), dtype=torch.float32)
    ids = _chat_ids(imported)
    with torch.no_grad():
        assert torch.equal(folder(ids).logits, direct(ids).logits)
        native = load_model(imported, torch.float32, "cpu")(ids)
        torch.testing.assert_close(native, direct(ids).logits, rtol=0, atol=1e-4)


def test_an_imported_gguf_keeps_its_chat_template_and_ends_on_the_end_of_turn_token(imported: Path) -> None:
    template = (imported / "chat_template.jinja").read_text()
    assert "<|im_start|>" in template
    tok = load_tokenizer(imported)
    im_end = transformers.AutoTokenizer.from_pretrained(str(imported)).convert_tokens_to_ids("<|im_end|>")
    assert im_end in tok.stop_ids
    assert tok.encode("17 + 25") == transformers.AutoTokenizer.from_pretrained(str(imported))("17 + 25")["input_ids"]


def test_a_file_that_is_not_gguf_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RHYMERL_CACHE", str(tmp_path / "cache"))
    fake = tmp_path / "weights.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelError) as err:
        model_dir(str(fake))
    assert str(err.value) == f"model.path: {fake}: not a GGUF file (it does not start with the bytes 'GGUF')"
    assert not (tmp_path / "cache").exists()


def test_an_architecture_transformers_cannot_read_is_refused_naming_the_file(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "no-such-arch")
    writer.add_tensor("x.weight", torch.zeros(4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelError, match=rf"^{path}: transformers cannot read it: .*no-such-arch") as err:
        import_gguf(path, tmp_path / "out")
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.gguf"]  # nothing half-written


def test_a_gguf_path_is_imported_once_and_reused(tiny_gguf: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RHYMERL_CACHE", str(tmp_path))
    first = model_dir(str(tiny_gguf))
    inode = (first / "model.safetensors").stat().st_ino

    def no_second_import(gguf: Path, folder: Path) -> None:
        raise AssertionError("imported again")

    monkeypatch.setattr(gguf_import, "_write", no_second_import)
    assert model_dir(str(tiny_gguf)) == first
    assert (first / "model.safetensors").stat().st_ino == inode
    assert first.parent == tmp_path / "models" / "gguf"


def test_an_importer_that_loses_the_race_uses_the_winners_folder(tmp_path: Path) -> None:
    final, late = tmp_path / "final", tmp_path / ".late.tmp"
    for folder, text in ((final, "winner"), (late, "loser")):
        folder.mkdir()
        (folder / "config.json").write_text(text)
    assert gguf_import._publish(late, final) is False
    assert (final / "config.json").read_text() == "winner"
    assert not late.exists()


def test_model_import_refuses_a_folder_that_is_not_empty(tiny_gguf: Path, tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    res = subprocess.run([sys.executable, "-P", "-m", "rhymerl.cli.main", "model", "import", str(tiny_gguf),
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 2
    assert res.stderr.splitlines() == [f"error: {tmp_path}: already exists and is not an empty folder"]
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_an_unknown_builtin_lists_the_known_ones() -> None:
    with pytest.raises(ModelError) as err:
        model_dir("builtin:gpt-17")
    assert str(err.value) == ("model.path: unknown builtin 'builtin:gpt-17' (known: builtin:tiny-arith, "
                              "builtin:tiny-arith-draft, builtin:smollm2-135m-instruct)")


def test_a_missing_gguf_package_is_refused_naming_the_extra_that_installs_it(
        tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # what an install without the models extra finds
    with pytest.raises(ModelError) as err:
        import_gguf(tiny_gguf, tmp_path / "out")
    assert str(err.value) == (f"{tiny_gguf}: importing a GGUF model needs the 'gguf' package: pip install "
                              "'rhymerl[models]' (or bash scripts/setup.sh --models)")
    assert list(tmp_path.iterdir()) == []
