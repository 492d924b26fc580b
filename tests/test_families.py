"""
The model families' registry (llmc/families.py): each family found by its name, what its
module declares about itself agreeing with its model and config classes, and train.py's
--family taking its choices from the registry.
"""
import dataclasses

import numpy as np
import pytest

import train
from llmc import families
from llmc.families import FamilyError, family_names, get_family, preset_family


@pytest.mark.parametrize("name", family_names())
def test_each_family_declares_itself_consistently(name):
    family = get_family(name)
    assert family.name == name
    assert family.model_class.FAMILY == name   # the backend kernels its model requires
    groups = family.model_class.ENTRY_GROUPS
    assert groups[0] == "core" and name in groups
    config = family.config_class.from_name("d2", vocab_size=300)
    assert isinstance(config, family.config_class) and config.vocab_size == 300
    for preset in family.presets.values():
        assert isinstance(preset, family.config_class)
    model = family.model_class(config)
    assert model.param_layout.names == [n for n, _ in config.param_shapes()]
    labels = [label for label, _ in config.table_rows()]
    assert labels[:2] == ["max_sequence_length T", "vocab_size V"]


def test_a_family_reads_its_own_model_file(tmp_path):
    for name in family_names():
        family = get_family(name)
        model = family.model_class.random(family.config_class.from_name("d1", vocab_size=64))
        model.save(tmp_path / f"{name}.bin")
        config, params = family.read_model(tmp_path / f"{name}.bin")
        assert config == model.config and np.array_equal(params, model.params)


def test_presets_belong_to_their_family():
    assert preset_family("stories15M") == "llama"
    assert preset_family("d2") is None and preset_family(None) is None


def test_unknown_and_undeclared_families_are_one_line_errors():
    with pytest.raises(FamilyError, match="unknown model family 'gpt3' \\(known: gpt2, llama\\)"):
        get_family("gpt3")
    gpt2 = get_family("gpt2")
    with pytest.raises(ValueError, match="not a registered family"):
        families.define_family(dataclasses.replace(gpt2, name="gpt3"))


def test_train_py_takes_the_families_from_the_registry(capsys):
    with pytest.raises(SystemExit) as info:
        train.parse_args(["--family", "gpt3"])
    assert info.value.code == 2
    assert "choose from 'gpt2', 'llama'" in capsys.readouterr().err
    assert train.parse_args(["-e", "stories15M"]).family == "llama"
    assert train.parse_args(["-e", "d2"]).family == families.DEFAULT_FAMILY


def test_a_model_file_names_its_family_by_its_first_bytes(tmp_path):
    """llm.c's checkpoint, llama2.c's version 1 (magic) and version 0 (no magic: its sizes fill
    the file exactly), and GGUF; anything else, llm.c's other files among it, is one line."""
    from llmc.formats import FormatError
    from llmc.formats.gguf import sentencepiece_gguf_vocab, write_gguf
    from llmc.formats.llama2c import write_llama_model
    from llmc.families import family_of_file
    gpt2 = get_family("gpt2").model_class.random(get_family("gpt2").config_class.from_name("d1", vocab_size=64))
    gpt2.save(tmp_path / "gpt2.bin")
    llama = get_family("llama")
    config = dataclasses.replace(llama.config_class.from_name("d2", vocab_size=64),
                                 shared_classifier=False)
    params = np.random.default_rng(0).standard_normal(config.num_parameters()).astype(np.float32)
    for version in (0, 1):
        write_llama_model(tmp_path / f"v{version}.bin", config, params, version=version)
    vocab = sentencepiece_gguf_vocab([f"t{i}".encode() for i in range(64)], [0.0] * 64)
    write_gguf(tmp_path / "model.gguf", config, params, vocab)
    found = {name: family_of_file(tmp_path / name) for name in
             ("gpt2.bin", "v0.bin", "v1.bin", "model.gguf")}
    assert {name: (family.name, fmt) for name, (family, fmt) in found.items()} == {
        "gpt2.bin": ("gpt2", "llmc"), "v0.bin": ("llama", "llama2c"),
        "v1.bin": ("llama", "llama2c"), "model.gguf": ("llama", "gguf")}
    for name in ("v0.bin", "v1.bin", "model.gguf"):   # the family reads each of them back
        read_config, read_params = llama.read_model(tmp_path / name)
        assert read_config == config and np.array_equal(read_params, params)
    with open(tmp_path / "v0.bin", "ab") as f:   # a version-0 file one float too long is no model
        f.write(b"\0" * 4)
    (tmp_path / "notes.txt").write_text("not a model at all\n")
    with pytest.raises(FormatError, match="not a model file \\(it begins like a text file\\)"):
        family_of_file(tmp_path / "notes.txt")
    with pytest.raises(FormatError, match="not a model file"):
        family_of_file(tmp_path / "v0.bin")
    with pytest.raises(FormatError, match="a debug state of llm.c, not a model file"):
        family_of_file("tests/fixtures/gpt2_tiny_debug_state.bin")


def test_a_family_that_leaves_out_a_part_is_refused():
    """Model's own layer_backward does nothing: a family without its own would train with no
    gradient from its layers, so it is refused, by name, when constructed and when defined."""
    from faults import FamilyWithoutLayerBackward
    from llmc.model import unfilled
    config = get_family("gpt2").config_class.from_name("d1", vocab_size=64)
    with pytest.raises(TypeError, match=r"^FamilyWithoutLayerBackward does not fill in "
                                        r"layer_backward: "):
        FamilyWithoutLayerBackward(config)
    family = dataclasses.replace(get_family("gpt2"), model_class=FamilyWithoutLayerBackward)
    with pytest.raises(TypeError, match="layer_backward"):
        families.define_family(family)
    for name in family_names():   # the real families fill in everything
        assert unfilled(get_family(name).model_class) == []
