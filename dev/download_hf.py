"""
Downloads a Hugging Face model folder (config.json, the safetensors weights and their index, the
tokenizer's files and chat template) through huggingface_hub, for train.py -e, generate.py and
dev/export.py, which read the folder as it is.

    python dev/download_hf.py HuggingFaceTB/SmolLM2-135M          # -> models/SmolLM2-135M
    python dev/download_hf.py Qwen/Qwen3-0.6B --revision main -o qwen3
    python generate.py models/SmolLM2-135M -p "Once upon a time" -n 64

Only what llm.pyx reads is fetched (no PyTorch .bin, no ONNX or GGUF copies).  After the
download the folder is read once, so that an architecture or a config key llm.pyx does not
implement is said now (in one line, by name), not at the first training step.  It needs the
internet: offline (or with HF_HUB_OFFLINE=1) it says so in one line.  A gated model (Llama 3.2,
Mistral) needs `huggingface-cli login` first, with the licence accepted on its page.
"""
import argparse
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from llmc.families import FamilyError, family_of_file  # noqa: E402
from llmc.formats import FormatError, describe_model_file  # noqa: E402
from llmc.formats.hf_tokenizer import HF_TOKENIZER_FILES  # noqa: E402

WANTED = ["config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.model",
          *HF_TOKENIZER_FILES, "special_tokens_map.json"]
MODELS_DIR = os.path.join(REPO_ROOT, "models")


def download(repo, revision, output):
    """The folder of repo at revision in output (huggingface_hub's snapshot_download); one-line
    errors as RuntimeError."""
    try:
        import huggingface_hub
        from huggingface_hub import errors
    except ImportError:
        raise RuntimeError("this needs huggingface_hub: pip install huggingface_hub") from None
    try:
        return huggingface_hub.snapshot_download(repo, revision=revision, local_dir=output,
                                                 allow_patterns=WANTED)
    except errors.GatedRepoError:
        raise RuntimeError(f"{repo} is gated: accept its licence on huggingface.co, then "
                           f"`huggingface-cli login`") from None
    except errors.RepositoryNotFoundError:
        raise RuntimeError(f"{repo}: no such model on huggingface.co (or it is private)") from None
    except errors.RevisionNotFoundError:
        raise RuntimeError(f"{repo}: no revision {revision!r}") from None
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled, OSError) as e:
        # snapshot_download says LocalEntryNotFoundError where the hub cannot be reached
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "")
        why = ("HF_HUB_OFFLINE is set" if offline else "huggingface.co cannot be reached"
               if isinstance(e, errors.LocalEntryNotFoundError) else " ".join(str(e).split()))
        raise RuntimeError(f"cannot download {repo} ({why}): this needs the internet") from None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("repo", help="the model's repository on huggingface.co (owner/name)")
    p.add_argument("--revision", default=None, help="a branch, tag or commit (default: main)")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="the folder to download into (default: models/NAME in the repository)")
    args = p.parse_args(argv)
    if args.repo.count("/") != 1:
        p.error(f"repo: {args.repo!r} is not owner/name (HuggingFaceTB/SmolLM2-135M, say)")
    output = args.output or os.path.join(MODELS_DIR, args.repo.split("/")[1])
    try:
        folder = download(args.repo, args.revision, output)
        family, _ = family_of_file(folder)
        family.read_model(folder)   # every key and tensor checked now
    except (RuntimeError, FormatError, FamilyError) as e:
        sys.exit(f"download_hf.py: error: {e}")
    print(f"{folder}: {describe_model_file(folder)}, the {family.name} family")
    print(f"generate with: python generate.py {os.path.relpath(folder)} -p \"Once upon a time\"")


if __name__ == "__main__":
    main()
