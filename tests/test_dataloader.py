"""
The DataLoader against llm.c's llmc/dataloader.h: the Mersenne Twister it shuffles with, the
order of shards and samples over epochs, the batches, the state round trip and bad shards.
"""
import os

import numpy as np
import pytest

import needs
from llmc.dataloader import MT19937, DataError, DataLoader, random_permutation
from llmc.formats.llmc import read_shard, write_shard


class ReferenceMT:
    """llm.c's mt19937_state written out plainly from llmc/rand.h (left_/next_ bookkeeping
    included), independent of NumPy's generator."""

    def __init__(self, seed):
        self.state = [seed & 0xFFFFFFFF]
        for j in range(1, 624):
            prev = self.state[-1]
            self.state.append((1812433253 * (prev ^ (prev >> 30)) + j) & 0xFFFFFFFF)
        self.left, self.next = 1, 0

    def _twist(self):
        s = self.state
        for j in range(624):
            y = (s[j] & 0x80000000) | (s[(j + 1) % 624] & 0x7FFFFFFF)
            s[j] = s[(j + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
        self.left, self.next = 624, 0

    def randint32(self):
        self.left -= 1
        if self.left <= 0:
            self._twist()
        y = self.state[self.next]
        self.next += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y

    def permute(self, data):
        for i in range(len(data) - 1, 0, -1):
            j = self.randint32() % (i + 1)
            data[i], data[j] = data[j], data[i]


def reference_sample_order(shard_samples, epochs):
    """(file index, sample index) in the order llm.c's shuffling loader serves them."""
    rng = ReferenceMT(42)
    shard_indices = list(range(len(shard_samples)))
    order = []
    for _ in range(epochs):
        rng.permute(shard_indices)
        for file_idx in shard_indices:
            samples = list(range(shard_samples[file_idx]))
            rng.permute(samples)
            order += [(file_idx, s) for s in samples]
    return order


def test_mt19937_matches_llmc_documented_values():
    # llmc/rand.h: manual_seed(&state, 137) then randint32 five times (torch gives the same)
    assert list(MT19937(137).randint32(5)) == [4053805790, 2173880614, 380293709, 1237255315,
                                              2986595568]


def test_mt19937_matches_reference_across_twists():
    ours, ref = MT19937(42), ReferenceMT(42)
    got = list(ours.randint32(700)) + list(ours.randint32(700))  # crosses two twists
    assert got == [ref.randint32() for _ in range(1400)]
    # NumPy's legacy seeding is init_genrand too: a second, independent witness
    legacy = np.random.RandomState(42).randint(0, 2**32, size=1400, dtype=np.uint64)
    assert got == [int(x) for x in legacy]


def test_random_permutation_matches_reference():
    for n in (0, 1, 2, 10, 1000):
        ours, ref = list(range(n)), list(range(n))
        random_permutation(ours, MT19937(42))
        ReferenceMT(42).permute(ref)
        assert ours == ref
    perm = list(range(10))
    random_permutation(perm, MT19937(42))
    assert perm == [1, 3, 9, 7, 6, 0, 8, 4, 5, 2]  # pinned; seed 42 as the train loader


def write_shards(tmp_path, sizes, prefix="train", offset=0):
    """Shards whose token k (counting over all shards) is (offset + k) % 50000, to locate
    every sample; the names sort in creation order."""
    start = offset
    for i, size in enumerate(sizes):
        write_shard(tmp_path / f"{prefix}_{i:03d}.bin",
                    np.arange(start, start + size) % 50000)
        start += size
    return str(tmp_path / f"{prefix}_*.bin")


def locate(inputs, B, T, sizes):
    """(file index, sample index) of a batch from write_shards' data."""
    first = int(inputs[0, 0])
    starts = np.cumsum([0] + sizes[:-1])
    file_idx = int(np.searchsorted(starts, first, side="right") - 1)
    offset = first - starts[file_idx]
    assert offset % (B * T) == 0
    return file_idx, int(offset // (B * T))


def test_shuffled_order_matches_llmc(tmp_path):
    B, T = 2, 8
    sizes = [16 * 7 + 1, 16 * 5 + 3, 16 * 9 + 16]  # 7, 5 and 9 samples
    pattern = write_shards(tmp_path, sizes)
    loader = DataLoader(pattern, B, T, shuffle=True)
    counts = [(n - 1) // (B * T) for n in sizes]
    expected = reference_sample_order(counts, epochs=3)
    got = []
    for _ in range(len(expected)):
        inputs, targets = loader.next_batch()
        assert inputs.shape == targets.shape == (B, T) and inputs.dtype == np.int32
        assert np.array_equal(targets.ravel()[:-1], inputs.ravel()[1:])  # shifted by one
        got.append(locate(inputs, B, T, sizes))
    assert got == expected
    # each epoch serves every sample exactly once
    per_epoch = sum(counts)
    for e in range(3):
        assert sorted(got[e * per_epoch:(e + 1) * per_epoch]) == sorted(
            (f, s) for f in range(3) for s in range(counts[f]))


def test_val_loader_is_sequential_and_wraps(tmp_path):
    B, T = 1, 4
    sizes = [4 * 3 + 1, 4 * 2 + 1]
    loader = DataLoader(write_shards(tmp_path, sizes, "val"), B, T, shuffle=False)
    order = [locate(loader.next_batch()[0], B, T, sizes) for _ in range(7)]
    assert order == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (0, 0), (0, 1)]
    loader.reset()
    assert locate(loader.next_batch()[0], B, T, sizes) == (0, 0)


def test_state_round_trip(tmp_path):
    B, T = 2, 4
    sizes = [8 * 5 + 1, 8 * 3 + 1]
    pattern = write_shards(tmp_path, sizes)
    straight = DataLoader(pattern, B, T, shuffle=True)
    batches = [straight.next_batch()[0] for _ in range(20)]
    for stop in (0, 3, 5, 8, 13):
        first = DataLoader(pattern, B, T, shuffle=True)
        for _ in range(stop):
            first.next_batch()
        state = {k: np.array(v) for k, v in first.state().items()}
        resumed = DataLoader(pattern, B, T, shuffle=True)
        resumed.next_batch()  # its own position must not matter
        resumed.load_state(state)
        for k in range(stop, 20):
            assert np.array_equal(resumed.next_batch()[0], batches[k]), (stop, k)


def test_state_of_other_data_is_refused(tmp_path):
    pattern = write_shards(tmp_path, [8 * 5 + 1, 8 * 3 + 1])
    state = DataLoader(pattern, 2, 4, shuffle=True).state()
    with pytest.raises(DataError, match="T="):
        DataLoader(pattern, 1, 4, shuffle=True).load_state(state)
    one = write_shards(tmp_path, [8 * 5 + 1], prefix="one")
    with pytest.raises(DataError, match="2 shards"):
        DataLoader(one, 2, 4, shuffle=True).load_state(state)


def write_bytes(path, data):
    path.write_bytes(data)
    return str(path)


def write_raw(path, header_values, tokens=b""):
    header = np.zeros(256, dtype="<i4")
    header[:len(header_values)] = header_values
    path.write_bytes(header.tobytes() + tokens)
    return str(path)


@pytest.mark.parametrize("make, message", [
    (lambda p: str(p / "missing_*.bin"), "no file matches"),
    (lambda p: str(p / "missing.bin"), "no such file"),
    (lambda p: write_bytes(p / "empty.bin", b""), "empty file"),
    (lambda p: write_bytes(p / "short.bin", b"\x00" * 10), "bad magic"),
    (lambda p: write_bytes(p / "header.bin", np.array([20240520, 1], "<i4").tobytes()),
     "truncated"),
    (lambda p: write_raw(p / "magic.bin", [20240326, 1, 100], b"\x00" * 200),
     "this is a model checkpoint, not a GPT-2 token shard"),
    (lambda p: write_raw(p / "version.bin", [20240520, 7, 100], b"\x00" * 200), "version 7"),
    (lambda p: write_raw(p / "zero.bin", [20240520, 1, 0]), "too small: 0 tokens"),
    (lambda p: write_raw(p / "size.bin", [20240520, 1, 100], b"\x00" * 150),
     "truncated: expected 1224 bytes"),
    (lambda p: write_raw(p / "long.bin", [20240520, 1, 100], b"\x00" * 250), "too long"),
    (lambda p: write_raw(p / "small.bin", [20240520, 1, 16], b"\x00" * 32), "too small"),
])
def test_bad_shards_raise_one_line(tmp_path, make, message):
    with pytest.raises(DataError) as e:
        DataLoader(make(tmp_path), 2, 8, shuffle=True)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_token_outside_vocab(tmp_path):
    tokens = np.zeros(33, dtype=np.int64)
    tokens[5] = 60000
    write_shard(tmp_path / "bad.bin", tokens)
    loader = DataLoader(str(tmp_path / "bad.bin"), 2, 8, shuffle=False, vocab_size=50257)
    with pytest.raises(DataError, match="token id 60000 at position 5"):
        loader.next_batch()


def test_shard_is_not_modified(tmp_path):
    pattern = write_shards(tmp_path, [8 * 5 + 1])
    before = open(pattern.replace("*", "000"), "rb").read()
    loader = DataLoader(pattern, 2, 4, shuffle=True)
    inputs, _ = loader.next_batch()
    inputs[:] = 0  # the batch is a copy, not a view of the mapped file
    assert open(pattern.replace("*", "000"), "rb").read() == before
    assert os.path.getsize(pattern.replace("*", "000")) == 1024 + 2 * 41


# ----------------------------------------------------------------------------
# the data scripts write shards the loader reads (GPT-2's ranks from ../shared, no network)


def run_script(tmp_path, *args):
    import shutil
    import subprocess
    import sys
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    shutil.copy(needs.shared(needs.GPT2_RANKS), cache / "gpt2.tiktoken")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=root,
                         env=dict(os.environ, LLMPYX_CACHE_DIR=str(cache)), timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_tinyshakespeare_script_matches_llmc(tmp_path):
    text = needs.shared(needs.TINYSHAKESPEARE)
    stdout = run_script(tmp_path, "dev/data/tinyshakespeare.py", "--input-text", text,
                        "--output-dir", str(tmp_path / "ts"))
    assert "writing 32,768 tokens" in stdout and "writing 305,260 tokens" in stdout
    train = DataLoader(str(tmp_path / "ts" / "tiny_shakespeare_train.bin"), 4, 64, shuffle=True,
                       vocab_size=50257)
    assert train.num_tokens == 305260
    val = read_shard(tmp_path / "ts" / "tiny_shakespeare_val.bin")
    assert val[0] == 50256 and list(val[1:4]) == [5962, 22307, 25]  # <eot> "First Citizen:"


def test_text_to_shards(tmp_path):
    (tmp_path / "a.txt").write_text("Hello world\n\nSecond paragraph <|endoftext|>\n" * 50)
    (tmp_path / "b.txt").write_text("Another document, in its own file.\n" * 30)
    stdout = run_script(tmp_path, "dev/data/text_to_shards.py", str(tmp_path / "a.txt"),
                        str(tmp_path / "b.txt"), "--name", "mine", "-o", str(tmp_path / "out"),
                        "--shard-size", "300")
    assert "mine_train_*.bin" in stdout
    val = read_shard(tmp_path / "out" / "mine_val_000000.bin")
    shards = sorted((tmp_path / "out").glob("mine_train_*.bin"))
    train = np.concatenate([read_shard(p) for p in shards])
    tokens = np.concatenate([val, train])
    assert len(shards) > 1 and all(len(read_shard(p)) <= 300 for p in shards)
    assert tokens[0] == 50256 and (tokens == 50256).sum() == 2  # one EOT per file
    assert abs(len(val) - 0.1 * len(tokens)) <= 1
    loader = DataLoader(str(tmp_path / "out" / "mine_train_*.bin"), 2, 16, shuffle=True,
                        vocab_size=50257)
    assert loader.num_tokens == len(train)
