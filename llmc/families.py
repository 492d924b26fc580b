"""
The model families, found by name: get_family("gpt2") imports the family's module
(train_gpt2.pyx) on first use and returns what that module declared about itself as it was
imported (define_family): its model and config classes, presets, defaults, model file reader
and PyTorch reference (the backend entry groups it runs on: its model class's ENTRY_GROUPS).
train.py, the tests and dev/ reach a family this way, never by comparing its name; as
accel/backend.pyx's registry does for backends, the names are known without importing (or
building) anything.

    register_family(name, module)   get_family(name) imports module, which calls define_family
"""
import importlib
from dataclasses import dataclass

__all__ = ["DEFAULT_FAMILY", "Family", "FamilyError", "define_family", "family_names",
           "family_of_file", "get_family", "preset_family", "register_family"]

DEFAULT_FAMILY = "gpt2"   # llm.c's


class FamilyError(Exception):
    """An unknown family, or one whose module is not built; one line."""


@dataclass(frozen=True)
class Family:
    name: str             # --family's value, and the backend family its model requires
    title: str            # how outputs name it: "GPT-2"
    model_class: type     # its model, an llmc.model.Model
    config_class: type    # its config: param_shapes(), describe(), from_name("dN", vocab_size=)
    presets: dict         # preset name -> config of published sizes (none: {})
    preset_noun: str      # what messages call a preset ("Llama preset"); None without presets
    random_inits: str     # what -e may name for a new random model, as messages say it
    default_init: str     # -e's default under --family NAME: a model file or a random init
    stand_in: str         # the random init in place of default_init when that is a model file
                          # not downloaded (None: none)
    download: str         # how to get default_init's weights (with stand_in)
    read_model: object    # path -> (config, float32 parameters) of a model file
    formats: tuple        # the model file formats read_model reads (llmc.formats.model_format)
    hf_architectures: tuple   # the Hugging Face architectures (config.json's) read_model reads
    reference: str        # the module of its PyTorch reference (train_gpt2_torch)


_MODULES = {}    # name -> the module that defines the family
_DEFINED = {}    # name -> Family, once its module is imported


def register_family(name, module):
    """Make get_family(name) import module (a dotted name), which calls define_family."""
    _MODULES[name] = module


def define_family(family):
    """Called by a family's module as it is imported: what the family is."""
    if family.name not in _MODULES:
        raise ValueError(f"define_family: {family.name!r} is not a registered family "
                         f"(register_family in llmc/families.py)")
    from llmc.model import refuse_unfilled   # compiled: the registry itself loads without a build
    refuse_unfilled(family.model_class)
    _DEFINED[family.name] = family


def family_names():
    """The registered families' names, without importing their modules."""
    return list(_MODULES)


def get_family(name):
    """The Family called name; FamilyError in one line if there is none or it is not built."""
    if name not in _MODULES:
        raise FamilyError(f"unknown model family '{name}' (known: {', '.join(_MODULES)})")
    if name not in _DEFINED:
        try:
            importlib.import_module(_MODULES[name])
        except ImportError as e:
            raise FamilyError(f"the model is not built ({e}): run `make train_gpt2` first") from None
        if name not in _DEFINED:
            raise FamilyError(f"{_MODULES[name]} defines no family '{name}' (define_family)")
    return _DEFINED[name]


def preset_family(init):
    """The name of the family one of whose presets init names, or None."""
    return next((name for name in _MODULES if init in get_family(name).presets), None)


def family_of_file(path):
    """(the Family whose model files path is one of, its format's name) by the file's first
    bytes (llmc.formats.model_format), and for Hugging Face's by config.json's architecture;
    FormatError for a file that is no model, FamilyError when no family reads it."""
    from llmc.formats import HF_FORMATS, model_format
    found = model_format(path)
    architecture = None
    if found in HF_FORMATS:
        from llmc.formats.huggingface import hf_architecture, hf_config_of
        architecture = hf_architecture(hf_config_of(path), path)
    for name in _MODULES:
        family = get_family(name)
        if found in family.formats and architecture in (None, *family.hf_architectures):
            return family, found
    raise FamilyError(f"{path}: no model family reads its format ({architecture or found})")


register_family("gpt2", "train_gpt2")
register_family("llama", "train_llama2")
