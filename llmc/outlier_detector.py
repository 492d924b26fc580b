"""
The z-score of each new value against a window of the latest ones, as llm.c's
llmc/outlier_detector.h: train.py -sl and -sg skip the update of a step whose loss or gradient
norm is an outlier (z above the threshold).

Its sums run in float64, added to and taken from as values come and go (llm.c's doubles), and
the z-score is of the new value against the window that already holds it:
z = (x - mean) / std, the population std. While the window fills, z is NaN (never an outlier);
a window of equal values gives 0. Since the new value is one of the window's W, z can reach at
most sqrt(W - 1): a threshold needs a window above its square plus one (llm.c's 128: 11.3).

state() and from_state() keep a detector in a checkpoint (llmc/checkpoint.py's outlier side
file) exactly: the window, its position and the running sums, so a resumed run goes on with the
very same z-scores.
"""
import math

__all__ = ["WINDOW", "OutlierDetector"]

WINDOW = 128   # llm.c's OUTLIER_DETECTOR_WINDOW_SIZE


class OutlierDetector:
    """The z-scores of a stream of values against the latest `window` of them."""

    def __init__(self, window=WINDOW):
        if window < 2:
            raise ValueError(f"OutlierDetector: the window must hold at least 2 values, "
                             f"got {window}")
        self.window = window
        self.values = []       # the window, filled in order, then overwritten from index on
        self.index = 0         # the oldest value once the window is full
        self.sum = 0.0
        self.sum_sq = 0.0

    def update(self, value):
        """Add value; its z-score against the window (NaN until the window is full)."""
        value = float(value)
        if len(self.values) < self.window:
            self.values.append(value)
            self.sum += value
            self.sum_sq += value * value
            return math.nan
        old = self.values[self.index]
        self.sum -= old
        self.sum_sq -= old * old
        self.values[self.index] = value
        self.sum += value
        self.sum_sq += value * value
        self.index = (self.index + 1) % self.window
        mean = self.sum / self.window
        variance = self.sum_sq / self.window - mean * mean
        std = math.sqrt(variance) if variance >= 0 else math.nan   # C's sqrt of < 0: NaN
        if std == 0.0:
            return 0.0
        return (value - mean) / std

    def state(self):
        """A dict of plain numbers (JSON keeps float64 exactly) from_state() restores."""
        return dict(window=self.window, values=list(self.values), index=self.index,
                    sum=self.sum, sum_sq=self.sum_sq)

    @classmethod
    def from_state(cls, state):
        """The detector of a state(); ValueError saying what is wrong with one that is not."""
        try:
            detector = cls(int(state["window"]))
            values = [float(v) for v in state["values"]]
            index = int(state["index"])
            total, total_sq = float(state["sum"]), float(state["sum_sq"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not an outlier detector's state ({e})") from None
        if len(values) > detector.window or not 0 <= index < detector.window or \
                (index and len(values) < detector.window):
            raise ValueError(f"not an outlier detector's state ({len(values)} values, index "
                             f"{index}, window {detector.window})")
        detector.values, detector.index = values, index
        detector.sum, detector.sum_sq = total, total_sq
        return detector
