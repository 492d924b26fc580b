"""
Activation checkpointing: which layers' activations the forward pass keeps and which the
backward pass recomputes.  Bookkeeping only, no memory: llmc/model.pyx lays out buffers and runs
the layers by this plan, llmc/dry_run.py prices it without allocating.

A model is an embedding, L layers and a head.  Layer l reads the residual stream at boundary l
(the embedding's output for l = 0, else layer l-1's output) and writes boundary l+1, its output;
its other activations, its internals, are what its backward needs.  The policies, as the ANE
training pipeline's planner names them:

    all        every layer's internals and output kept: nothing recomputed (the default)
    boundary   every boundary kept, one layer's internals: each layer is recomputed from its
               stored input just before its backward (every-1)
    every-N    the layers in segments of N; the boundary at each segment's end kept; backward
               recomputes a whole segment into N slots of internals, then walks back through it
    sqrt       every-N with N = ceil(sqrt(L)): about 2 sqrt(L) layers' worth of memory
    none       only what the loss needs: the embedding's output, the head's input and the head;
               one layer's internals and two streams.  The backward of layer l recomputes layers
               0..l from the embedding's output: L(L-1)/2 extra layer forwards per step,
               quadratic in L (d12: 66, i.e. 5.5 forward passes more)

The last segment is still in its slots when the forward pass ends, so backward starts on it
without recomputing.  A recomputed layer runs the same kernels on the same inputs as in the
forward pass (its input is a stored or recomputed boundary, bit for bit the forward's), so the
gradients are bit-identical across policies.
"""
import math

import numpy as np

__all__ = ["POLICIES", "RecomputePlan", "activation_shapes", "gradient_shapes", "parse_policy"]

POLICIES = "all, boundary, sqrt, every-N (N >= 1), none"


def parse_policy(policy):
    """policy, checked: one of POLICIES (ValueError, one line, otherwise)."""
    if policy in ("all", "boundary", "sqrt", "none"):
        return policy
    if isinstance(policy, str) and policy.startswith("every-"):
        n = policy[len("every-"):]
        if n.isdigit() and int(n) >= 1:
            return f"every-{int(n)}"
    raise ValueError(f"unknown recompute policy {policy!r}: one of {POLICIES}")


class RecomputePlan:
    """A policy on a model of num_layers layers: where each layer's activations live.

        slots             how many layers' internals are kept at once
        outputs           how many layer outputs (residual streams) are kept at once
        slot_of[l]        the slot that holds layer l's internals
        output_of[l]      the output tensor layer l writes (layer l+1 reads it)
        segment_start[l]  the first layer a recompute of layer l runs (from its stored input)
        recomputed        layer forwards one backward pass recomputes
    """

    def __init__(self, policy, num_layers):
        self.policy = parse_policy(policy)
        L = self.num_layers = int(num_layers)
        if L < 1:
            raise ValueError(f"RecomputePlan: num_layers must be at least 1, got {L}")
        layers = np.arange(L, dtype=np.int32)
        if self.policy == "all":
            self.slots = self.outputs = L
            self.slot_of, self.output_of, self.segment_start = layers, layers.copy(), layers.copy()
        elif self.policy == "none":
            chain = min(2, L - 1)             # the streams between layers, used in turn
            self.slots, self.outputs = 1, chain + 1
            self.slot_of = np.zeros(L, np.int32)
            self.output_of = np.where(layers == L - 1, chain, layers % 2).astype(np.int32)
            self.segment_start = np.zeros(L, np.int32)
        else:
            k = {"boundary": 1, "sqrt": math.isqrt(L - 1) + 1}.get(self.policy)
            k = min(L, k or int(self.policy[len("every-"):]))   # ceil(sqrt(L)) above
            segments = -(-L // k)
            chain = k - 1                     # the streams inside a segment
            last = (layers % k == k - 1) | (layers == L - 1)
            self.slots, self.outputs = k, chain + segments
            self.slot_of = (layers % k).astype(np.int32)
            self.output_of = np.where(last, chain + layers // k, layers % k).astype(np.int32)
            self.segment_start = (layers - layers % k).astype(np.int32)
        self.recomputed = sum(len(layers) for layers in self.recomputes())

    def recomputes(self):
        """[the layers recomputed just before layer l's backward, in order] for each layer l:
        llmc/model.pyx's backward, walked.  A layer is recomputed, with its segment's layers
        before it, when its slot no longer holds it (so a short last segment spares the layers
        of the one before still there).  The ANE planner (accel/ane/plan.py) schedules by it."""
        resident = [-1] * self.slots
        for l in range(self.num_layers):   # the forward pass
            resident[self.slot_of[l]] = l
        runs = [[] for _ in range(self.num_layers)]
        for l in range(self.num_layers - 1, -1, -1):
            if resident[self.slot_of[l]] != l:
                for j in range(self.segment_start[l], l + 1):
                    resident[self.slot_of[j]] = j
                    runs[l].append(j)
        return runs

    def __repr__(self):
        return (f"RecomputePlan({self.policy!r}, L={self.num_layers}: {self.slots} slots, "
                f"{self.outputs} outputs, {self.recomputed} layers recomputed)")


def activation_shapes(plan, embedding, layer, head):
    """The kept activations [(name, shape)] under plan: the embedding's output, each of a
    layer's internals stacked over the slots, its output stacked over the outputs, the head's.
    For all this is the family's whole layout (llm.c's 23 tensors for GPT-2).
        embedding   (name, shape) of the embedding's output, the stream into layer 0
        layer       one layer's [(name, shape)], the last its output
        head        the head's [(name, shape)]
    """
    *internals, (output, stream) = layer
    return ([embedding] + [(name, (plan.slots,) + tuple(shape)) for name, shape in internals] +
            [(output, (plan.outputs,) + tuple(stream))] + list(head))


def gradient_shapes(layer, head, no_grad=()):
    """The activation gradients [(name, shape)], the same under every plan: the head's, one
    layer's internals (zeroed before each layer's backward) and "dstream", two streams used in
    turn (the gradients into and out of the layer whose backward runs).  Tensors in no_grad (no
    kernel reads or writes their gradient) get none."""
    *internals, (_, stream) = layer
    return ([(name, shape) for name, shape in list(head) + internals if name not in no_grad] +
            [("dstream", (2,) + tuple(stream))])
