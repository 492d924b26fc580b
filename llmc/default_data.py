"""
train.py's default data: tinyshakespeare's token shards in dev/data/tinyshakespeare/, prepared
on first use by dev/data/tinyshakespeare.py (offline too, see there).
"""
import glob
import os
import sys

from llmc.dataloader import DataError
from llmc.logger import note
from llmc.tokenizer import TokenizerError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_SCRIPTS = os.path.join(REPO_ROOT, "dev", "data")
# paths relative to where train.py runs, for short messages; the files live in the repository
TRAIN = os.path.relpath(os.path.join(DATA_SCRIPTS, "tinyshakespeare", "tiny_shakespeare_train.bin"))
VAL = os.path.relpath(os.path.join(DATA_SCRIPTS, "tinyshakespeare", "tiny_shakespeare_val.bin"))


def prepare(train_pattern, val_pattern):
    """Tokenize tinyshakespeare into the default shards when these are the default patterns
    and a shard is missing. Raises DataError."""
    if train_pattern != TRAIN or val_pattern != VAL:
        return
    if glob.glob(TRAIN) and glob.glob(VAL):
        return
    note("no tinyshakespeare shards yet, preparing them (dev/data/tinyshakespeare.py)")
    if DATA_SCRIPTS not in sys.path:
        sys.path.insert(0, DATA_SCRIPTS)
    import tinyshakespeare
    try:
        tinyshakespeare.prepare()
    except (tinyshakespeare.DataPrepError, TokenizerError, OSError) as e:
        raise DataError(f"cannot prepare tinyshakespeare: {e}") from None
