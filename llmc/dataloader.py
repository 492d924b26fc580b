"""
The DataLoader of llm.pyx: serves (B, T) batches of inputs and targets from llm.c token shards,
the way llm.c's llmc/dataloader.h does, so that the same shards give the same batches.

- The shards are the files that match a glob pattern, sorted by name. Each one is a 1024-byte
  header (magic 20240520, version 1, number of tokens) and then the tokens as uint16, read
  with llmc.formats.llmc.read_shard.
- A shard of ntok tokens holds (ntok - 1) // (N*B*T) samples, N the number of processes that
  train together (llmc/distributed.py; 1 alone): sample i is the tokens [i*N*B*T, (i+1)*N*B*T
  + 1), and process r of N reads its part of it, the B*T+1 tokens from i*N*B*T + r*B*T: inputs
  the first B*T, targets the last B*T.
- Training (shuffle=True): a Mersenne Twister seeded with 42 + r (llm.c's mt19937, which is
  torch's) permutes the order of the shards at the start of every epoch and the order of the
  samples each time a shard is opened. Validation (shuffle=False): in order, from the start.
  As llm.c's, every process shuffles with its own seed: with N > 1 the processes of a step read
  parts of different samples, each its own permutation.
- state() / load_state() save and restore the position, the permutations and the RNG, so a
  resumed run reads exactly the batches an uninterrupted one would have.

Problems with the data (no file matches, a file that is not a shard, one too small for a
single batch, a token id the model does not have) raise DataError, whose message is one
line naming the file.
"""
import glob

import numpy as np

from llmc.formats import FormatError
from llmc.formats.llmc import read_shard

SHUFFLE_SEED = 42  # llm.c: manual_seed(&shuffle_rng, 42 + process_rank)


class DataError(ValueError):
    """Data that cannot be served; str(e) is one line, "<path>: <problem>"."""


# ----------------------------------------------------------------------------
# llm.c's random number generator (llmc/rand.h)

class MT19937:
    """The 32-bit Mersenne Twister as llm.c (and torch) seed and draw it.

    llm.c's manual_seed is the reference init_genrand; NumPy's MT19937 runs the same
    recurrence and tempering, but hashes its seed differently, so the seeded state is built
    here and handed to NumPy, which then draws (random_raw) at C speed."""

    N = 624

    def __init__(self, seed):
        key = np.empty(self.N, dtype=np.uint32)
        x = seed & 0xFFFFFFFF
        for j in range(self.N):
            key[j] = x
            x = (1812433253 * (x ^ (x >> 30)) + j + 1) & 0xFFFFFFFF
        self.bit_generator = np.random.MT19937()
        # pos = N: the next draw twists the whole state first, as llm.c's left_ = 1 does
        self.set_state(key, self.N)

    def randint32(self, count):
        """The next `count` outputs of llm.c's randint32, as an int64 array."""
        return self.bit_generator.random_raw(count).astype(np.int64)

    def state(self):
        """(key: 624 uint32, pos): everything the next draws depend on."""
        s = self.bit_generator.state["state"]
        return np.array(s["key"], dtype=np.uint32), int(s["pos"])

    def set_state(self, key, pos):
        key = np.asarray(key, dtype=np.uint32)
        if key.shape != (self.N,) or not 0 <= pos <= self.N:
            raise ValueError(f"MT19937: bad state (key of shape {key.shape}, pos {pos})")
        self.bit_generator.state = {"bit_generator": "MT19937",
                                    "state": {"key": key.copy(), "pos": int(pos)}}


def random_permutation(indices, rng):
    """Shuffle `indices` in place as llm.c's random_permutation: Fisher-Yates from the end,
    swapping i with randint32 % (i + 1)."""
    n = len(indices)
    if n < 2:
        return  # llm.c draws nothing for 0 or 1 elements
    draws = rng.randint32(n - 1)  # the draw for i = n-1 first, down to i = 1
    for k, i in enumerate(range(n - 1, 0, -1)):
        j = int(draws[k] % (i + 1))
        indices[i], indices[j] = indices[j], indices[i]


# ----------------------------------------------------------------------------
# shards

def shard_files(pattern):
    """The shards of a glob pattern, sorted by name; DataError when there are none."""
    files = sorted(glob.glob(pattern))
    if not files:
        what = "no file matches this pattern" if glob.has_magic(pattern) else "no such file"
        raise DataError(f"{pattern}: {what}")
    return files


def shard_tokens(path, dtype=None):
    """The tokens of the shard at path, a read-only uint16 or uint32 memmap by its layout, or
    dtype's, the other refused by name (llmc.formats.llmc.read_shard checks its header and
    size). Raises DataError."""
    try:
        return read_shard(path, mmap=True, dtype=dtype)
    except FormatError as e:
        raise DataError(str(e)) from None


class DataLoader:
    """Batches of (B, T) inputs and targets, int32, from the shards matching `pattern`: this
    process's part (process_rank of num_processes) of each sample."""

    def __init__(self, pattern, B, T, shuffle, vocab_size=None, process_rank=0, num_processes=1,
                 token_map=None):
        if not 0 <= process_rank < num_processes:
            raise ValueError(f"process_rank {process_rank} is not one of {num_processes}")
        self.B, self.T = B, T
        self.process_rank, self.num_processes = process_rank, num_processes
        self.sample_size = num_processes * B * T  # tokens of one sample, all processes' parts
        self.shuffle = shuffle
        self.vocab_size = vocab_size  # token ids must be below it (checked per batch)
        self.token_map = token_map  # --compact-vocab: llmc/vocab.py's VocabMap, applied per batch
        self.files = shard_files(pattern)
        # validate every shard up front, so a bad one fails now and not hours into training
        self.shard_num_tokens = []
        self.dtype = shard_tokens(self.files[0]).dtype   # every shard's layout is the first's
        for path in self.files:
            ntok = len(shard_tokens(path, self.dtype))
            if ntok < self.sample_size + 1:
                processes = f" x {num_processes} processes" if num_processes > 1 else ""
                raise DataError(f"{path}: too small: {ntok} tokens, a batch of B={B} x T={T}"
                                f"{processes} needs {self.sample_size + 1}")
            self.shard_num_tokens.append(ntok)
        self.num_tokens = sum(self.shard_num_tokens)
        if shuffle:
            self.rng = MT19937(SHUFFLE_SEED + process_rank)
            self.shard_indices = list(range(len(self.files)))
        self.reset()

    # --- position in the data ---------------------------------------------------------

    def _open_shard(self, shard_idx):
        """Map the shard at position shard_idx of this epoch's order."""
        file_idx = self.shard_indices[shard_idx] if self.shuffle else shard_idx
        self.current_path = self.files[file_idx]
        self.tokens = shard_tokens(self.current_path, self.dtype)
        # each sample takes N*B*T+1 tokens but they advance by N*B*T: the last only targets
        self.shard_num_samples = (len(self.tokens) - 1) // self.sample_size

    def _permute_samples(self):
        self.intra_shard_indices = list(range(self.shard_num_samples))
        random_permutation(self.intra_shard_indices, self.rng)

    def reset(self):
        """Back to the first shard; for training, a new epoch: shuffle shards, then samples."""
        self.current_shard_idx = 0
        self.current_sample_idx = 0  # the next sample to serve from this shard
        if self.shuffle:
            random_permutation(self.shard_indices, self.rng)
        self._open_shard(0)
        if self.shuffle:
            self._permute_samples()

    def _advance(self):
        """On to the next shard, or to a new epoch after the last."""
        if self.current_shard_idx == len(self.files) - 1:
            self.reset()
            return
        self.current_shard_idx += 1
        self.current_sample_idx = 0
        self._open_shard(self.current_shard_idx)
        if self.shuffle:
            self._permute_samples()

    def next_batch(self):
        """The next (inputs, targets), each (B, T) int32."""
        if self.current_sample_idx >= self.shard_num_samples:
            self._advance()  # only now, as llm.c: the next shard's shuffle draws come late
        idx = self.current_sample_idx
        self.current_sample_idx += 1
        if self.shuffle:
            idx = self.intra_shard_indices[idx]
        BT = self.B * self.T
        start = idx * self.sample_size + self.process_rank * BT
        buf = np.array(self.tokens[start:start + BT + 1], dtype=np.int32)
        if self.token_map is not None:
            buf = self.token_map.compact(buf, self.current_path, start)
        if self.vocab_size is not None:
            top = int(buf.max())
            if top >= self.vocab_size:
                pos = start + int(np.argmax(buf >= self.vocab_size))
                raise DataError(f"{self.current_path}: token id {top} at position {pos} is "
                                f"outside the model's vocabulary of {self.vocab_size}")
        return buf[:-1].reshape(self.B, self.T), buf[1:].reshape(self.B, self.T)

    # --- resuming ---------------------------------------------------------------------

    def state(self):
        """dict of NumPy arrays: everything the following batches depend on."""
        state = {
            "num_shards": np.array(len(self.files), dtype=np.int64),
            "shard_idx": np.array(self.current_shard_idx, dtype=np.int64),
            "sample_idx": np.array(self.current_sample_idx, dtype=np.int64),
            "shard_num_samples": np.array(self.shard_num_samples, dtype=np.int64),
        }
        if self.shuffle:
            key, pos = self.rng.state()
            state.update(shard_indices=np.array(self.shard_indices, dtype=np.int32),
                         intra_shard_indices=np.array(self.intra_shard_indices, dtype=np.int32),
                         rng_key=key, rng_pos=np.array(pos, dtype=np.int64))
        return state

    def load_state(self, state, source="the training state"):
        """Continue from a state() taken on a loader over the same shards, B and T."""
        if int(state["num_shards"]) != len(self.files):
            raise DataError(f"{source}: saved for {int(state['num_shards'])} shards, "
                            f"the pattern now matches {len(self.files)}")
        if self.shuffle:
            shard_indices = [int(i) for i in state["shard_indices"]]
            if sorted(shard_indices) != list(range(len(self.files))):
                raise DataError(f"{source}: the saved shard order is not a permutation of "
                                f"the {len(self.files)} shards")
            self.shard_indices = shard_indices
            self.rng.set_state(state["rng_key"], int(state["rng_pos"]))
        self.current_shard_idx = int(state["shard_idx"])
        if not 0 <= self.current_shard_idx < len(self.files):
            raise DataError(f"{source}: shard position {self.current_shard_idx} out of range")
        self._open_shard(self.current_shard_idx)
        if self.shard_num_samples != int(state["shard_num_samples"]):
            raise DataError(f"{source}: {self.current_path} now holds {self.shard_num_samples} "
                            f"samples of B={self.B} x T={self.T}, the state was saved with "
                            f"{int(state['shard_num_samples'])} (changed data, B or T?)")
        if self.shuffle:
            self.intra_shard_indices = [int(i) for i in state["intra_shard_indices"]]
        self.current_sample_idx = int(state["sample_idx"])
        if not 0 <= self.current_sample_idx <= self.shard_num_samples:
            raise DataError(f"{source}: sample position {self.current_sample_idx} out of range")
