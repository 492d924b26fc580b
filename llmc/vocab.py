"""
Vocabulary compaction (train.py --compact-vocab): the model's vocabulary is only the token ids
that appear in the training data (and the token samples start from), renumbered 0..K-1 in
increasing order, as the ANE training project does to shrink the embedding and classifier.

    ids[k]        the original id of compact id k (sorted, unique)      (K,)
    index[t]      the compact id of original id t, -1 where t is unseen  (65536,)

The shards stay as they are: the data loader maps each batch through index on load
(DataLoader(token_map=...)), the samples decode through ids (tokenizer()), and the map is
saved in the output dir as vocab_map.bin beside the checkpoints, so a resumed run and the
dashboard's samples use the same one. Its file is a token shard (llmc.formats.llmc.write_shard)
of ids.

It changes the objective: the softmax runs over the K seen tokens only, so the model can never
predict an unseen one and its loss is not comparable with a full-vocabulary model's.
"""
import numpy as np

from llmc.dataloader import DataError, shard_tokens
from llmc.formats import FormatError
from llmc.formats.llmc import GPT2_EOT_TOKEN, read_shard, write_shard

__all__ = ["MAP_NAME", "VocabMap"]

MAP_NAME = "vocab_map.bin"
NUM_IDS = 2 ** 16   # token shards hold uint16 ids
CHUNK = 1 << 24     # tokens counted at once (128 MiB as int64)


class VocabMap:
    """The original ids kept, in order, and the way back."""

    def __init__(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0 or np.any(np.diff(ids) <= 0) or ids[0] < 0 \
                or ids[-1] >= NUM_IDS:
            raise ValueError("VocabMap: ids must be increasing token ids in [0, 65536)")
        self.ids = ids.astype(np.int32)
        self.index = np.full(NUM_IDS, -1, dtype=np.int32)
        self.index[self.ids] = np.arange(len(ids), dtype=np.int32)

    def __len__(self):
        return len(self.ids)

    @classmethod
    def from_shards(cls, paths, extra=()):
        """The ids in these shards (one pass, a count per id), and the extra ones."""
        seen = np.zeros(NUM_IDS, dtype=bool)
        for path in paths:
            tokens = shard_tokens(path)
            for start in range(0, len(tokens), CHUNK):   # bincount widens to int64: in chunks
                seen |= np.bincount(tokens[start:start + CHUNK], minlength=NUM_IDS) > 0
        seen[list(extra)] = True
        return cls(np.flatnonzero(seen))

    def compact(self, tokens, source="", offset=0):
        """tokens (original ids) as compact ids, int32; a token the map lacks is a DataError
        naming source and its position (offset + its index)."""
        out = self.index[tokens]
        if out.size and out.min() < 0:
            i = int(np.argmax(out < 0))
            raise DataError(f"{source}: token id {int(tokens.flat[i])} at position {offset + i} "
                            f"is not in the compacted vocabulary (the {len(self)} ids of the "
                            f"training data, --compact-vocab)")
        return out

    def check_shards(self, paths):
        """Every token of these shards is in the map, else the DataError of the first not."""
        for path in paths:
            tokens = shard_tokens(path)
            for start in range(0, len(tokens), CHUNK):
                self.compact(np.asarray(tokens[start:start + CHUNK]), path, start)

    def save(self, path):
        write_shard(path, self.ids)

    @classmethod
    def load(cls, path):
        """The map of a vocab_map.bin; llmc.formats.FormatError when it is not one."""
        ids = read_shard(path)
        try:
            return cls(ids)
        except ValueError:
            raise FormatError(path, "not a vocabulary map: its ids are not increasing "
                                    "(or there are none)") from None

    def tokenizer(self, tokenizer):
        """A Tokenizer of the compact ids: each decodes as its original id does in tokenizer
        (as the original id and a space when tokenizer is None; starting from GPT-2's
        <|endoftext|>, as the sampler does then)."""
        from llmc.tokenizer import Tokenizer
        start = GPT2_EOT_TOKEN if tokenizer is None else tokenizer.eot_token
        if self.index[start] < 0:
            raise ValueError(f"VocabMap: the samples' first token {start} is not in the map")
        if tokenizer is None:
            token_bytes = [f"{t} ".encode() for t in self.ids]
            return Tokenizer(token_bytes, int(self.index[start]), "token ids")
        token_bytes = [tokenizer.token_bytes[t] for t in self.ids]
        return Tokenizer(token_bytes, int(self.index[start]), f"{tokenizer.source}, compacted",
                         tokenizer.space_after_eot)
