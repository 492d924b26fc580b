"""
Data-parallel training on many processes, on one machine or many, through MPI (mpi4py): what
llm.c's llmc/zero.cuh does with NCCL and MPI, for train.py (and finetune.py, at stage 0: under
LoRA the model's gradients, and so what is summed, are its updates' alone).

    OMP_NUM_THREADS=1 mpirun -np 2 python train.py -d 512 ...

Every process (rank) holds the whole model and trains it on its own part of each batch (the
DataLoader's process_rank / num_processes, as llm.c's). After the backward passes the gradients
are summed across the processes, so every rank takes the same AdamW step:
- zero_stage 0: an all-reduce of the whole gradient, and every rank updates every parameter;
- zero_stage 1 (ZeRO-1, llm.c's -z 1): a reduce-scatter, after which each rank holds the summed
  gradient of its own span of the parameters only (its shard), keeps AdamW's m and v of that
  span only (Model.optimizer_shard), updates it, and then all ranks all-gather the parameters
  (at bf16: the float32 master weights, from which every rank then rounds its bf16 ones with
  the update's seed, so that they are bit for bit those of one process).
  The spans are contiguous and balanced (any number of processes), where llm.c cuts each
  tensor in num_processes equal pieces: the per-rank state files hold this span of m and v.

One process, or no MPI launcher, needs no mpi4py and changes nothing: SINGLE below does every
collective as a no-op. Whether the process was started by an MPI launcher is told by the
variables the launchers set (Open MPI, MPICH / Intel MPI hydra, MVAPICH, PMIx / Slurm's srun);
the rank and the number of processes are then MPI's own.

Only rank 0 prints: the others have their stdout and stderr sent to /dev/null at init(). An error
on any rank ends the whole job through MPI_Abort (fail() / abort_on_exception()), never a
rank left waiting in a collective.

The buffers, by where the backend's memory is (the path train.py names in its table, "all-reduce"):
- the host's (cpu): MPI reduces the model's gradient buffer and gathers its parameter buffer in
  place (zero-copy NumPy views);
- a device's, with the backend's collectives group (accel/spec.py; hip: NCCL on NVIDIA, RCCL on
  AMD, accel/hip/collectives.hip): on the device, in place, as llm.c's zero.cuh. The
  communicator is set up as llm.c's: rank 0 makes the unique id (comm_unique_id), MPI broadcasts
  it, every rank joins (comm_init). ZeRO-1 is a reduce-scatter of the gradients, each rank's
  update of its span, an all-gather of the float32 master weights, as on the host. Each process
  takes its own device: its rank among the processes of its machine (LLMPYX_LOCAL_RANK, which
  the HIP backend reads when it makes its context). Never run on a GPU (none was lent to this
  work): the emulated build of accel/hip runs it in CI, each rank a process and the emulated
  RCCL's ranks meeting in shared memory (accel/emu/rccl);
- a device's without that group (guard:cpu, check:hip, a GPU build made without NCCL/RCCL), or
  with LLMPYX_HOST_COLLECTIVES=1 (the fallback, kept tested): copied to the host, MPI there, and
  copied back (correct, slow).
Every rank takes the same path (they agree through MPI before the first collective).
"""
import os
import sys
import time
import traceback

import numpy as np

# the launchers' variables: size (or None: ask MPI) of the job that started this process
LAUNCHER_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
LAUNCHER_RANK_VARIABLES = ("PMIX_RANK",)  # PMIx (srun --mpi=pmix, prterun) tells no size
ERROR_GRACE_S = 1.0  # a rank other than 0 waits this long before printing its error (see fail)
HOST_COLLECTIVES_VARIABLE = "LLMPYX_HOST_COLLECTIVES"  # "1": a device backend's through host copies
LOCAL_RANK_VARIABLE = "LLMPYX_LOCAL_RANK"  # set by init(): this process's rank on its machine
DEVICE_COLLECTIVES = "collectives"  # the backend's entry group (accel/spec.py)


class DistributedError(Exception):
    """MPI cannot be set up as asked; one line."""


def launched_size():
    """The number of processes the MPI launcher started, 1 when there is none, None when the
    launcher does not say (PMIx: MPI must be asked)."""
    for name in LAUNCHER_SIZE_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    if any(name in os.environ for name in LAUNCHER_RANK_VARIABLES):
        return None
    return 1


class MultiProcessConfig:
    """llm.c's MultiGpuConfig: this process's rank among num_processes, the ZeRO stage, the
    span of the parameters this rank's optimizer owns, and the collectives train.py uses."""

    def __init__(self, comm=None):
        self.comm = comm  # mpi4py's COMM_WORLD, None for one process
        self.process_rank = 0 if comm is None else comm.Get_rank()
        self.num_processes = 1 if comm is None else comm.Get_size()
        self.zero_stage = 0
        self.shard_counts = None   # ZeRO-1: parameters owned by each rank
        self.shard_offsets = None  # and where each rank's span starts
        self.collective_time_s = 0.0  # seconds spent in collectives (train.py's share of step)
        self._scratch = None  # the reduce-scatter's output (MPI forbids in-place with offsets)
        self.on_device = False  # the gradients and parameters are summed on the device
        self._communicator_of = None  # the backend whose device communicator is set up

    # --- setup ----------------------------------------------------------------------------

    def set_zero_stage(self, zero_stage, model):
        """llm.c's set_zero_configs: ZeRO-1 gives each rank a balanced contiguous span of the
        parameters for its optimizer (Model.optimizer_shard); stage 0 keeps the whole. Then
        the collectives' path for the model's backend (choose_path)."""
        P, N = model.num_parameters, self.num_processes
        self.zero_stage = zero_stage if N > 1 else 0  # one process: the shard is everything
        if self.zero_stage == 1:
            if P < N:
                raise DistributedError(f"-z 1: {P} parameters cannot be shared by {N} processes")
            self.shard_counts = np.array([P // N + (r < P % N) for r in range(N)], dtype=np.int64)
            self.shard_offsets = np.concatenate(([0], np.cumsum(self.shard_counts)[:-1]))
            start = int(self.shard_offsets[self.process_rank])
            model.optimizer_shard = (start, start + int(self.shard_counts[self.process_rank]))
        self.choose_path(model.backend)

    def choose_path(self, backend):
        """On the device where the backend has the collectives group, its memory is a device's
        and LLMPYX_HOST_COLLECTIVES is not 1, on every rank; then the device communicator is set
        up (once per backend). Else MPI on the host (in place, or through copies)."""
        if self.comm is None:
            return
        from mpi4py import MPI
        wanted = (not backend.host_visible and backend.supports(DEVICE_COLLECTIVES)
                  and os.environ.get(HOST_COLLECTIVES_VARIABLE, "") != "1")
        self.on_device = bool(self.comm.allreduce(int(wanted), op=MPI.MIN))
        if self.on_device and self._communicator_of is not backend:
            unique_id = np.zeros(128, dtype=np.uint8)  # NCCL's ncclUniqueId
            if self.process_rank == 0:
                self._device(backend, "comm_unique_id", unique_id)
            self.comm.Bcast(unique_id, root=0)
            self._device(backend, "comm_init", unique_id, self.process_rank, self.num_processes)
            self._communicator_of = backend

    def path(self, backend):
        """The collectives' path, in a few words (train.py's table); None for one process."""
        if self.comm is None:
            return None
        if self.on_device:
            return f"on the device ({backend.name}'s collectives: NCCL / RCCL)"
        if backend.host_visible and backend.grad_precision == "fp32":
            return "MPI on the host memory, in place"
        if backend.host_visible:
            return f"MPI on float32 copies of the {backend.grad_precision} gradients"
        return "MPI through host copies"

    def _device(self, backend, entry, *args):
        """One entry of the backend's collectives group; its failure (a rank that ended, a
        library error) as a DistributedError, one line."""
        from accel.backend import BackendError
        try:
            backend.call(entry, *args)
        except BackendError as e:
            raise DistributedError(f"the device collectives failed: {e}") from None

    # --- collectives ----------------------------------------------------------------------

    def _timed(self, fn, *args):
        start = time.perf_counter()
        result = fn(*args)
        self.collective_time_s += time.perf_counter() - start
        return result

    def reduce_gradients(self, model):
        """Sum the gradients of all ranks into model.grads: the whole of it (stage 0), or only
        this rank's optimizer shard (ZeRO-1, a reduce-scatter; the rest is left as it was)."""
        if self.comm is not None:
            self._timed(self._reduce_gradients, model)

    def _reduce_gradients(self, model):
        if self.on_device:
            grads, _ = model.collective_buffers()
            entry = "all_reduce_sum" if self.zero_stage == 0 else "reduce_scatter_sum"
            self._device(model.backend, entry, grads, model.num_parameters)
            model.backend.synchronize()  # so that collective_time_s is the collective's
            return
        from mpi4py import MPI
        # model.grads is the model's own memory where the backend's is the host's and the
        # gradients float32; else a copy (read-only off a device: made writable), summed in
        # float32 and loaded back (bf16 gradients: rounded once, after the sum)
        own = model.backend.host_visible and model.grad_precision == "fp32"
        grads = np.require(model.grads, requirements="W")
        if self.zero_stage == 0:
            self.comm.Allreduce(MPI.IN_PLACE, grads, op=MPI.SUM)
        else:
            start, end = model.optimizer_shard
            if self._scratch is None or self._scratch.size != end - start:
                self._scratch = np.empty(end - start, dtype=np.float32)
            self.comm.Reduce_scatter(grads, self._scratch, self.shard_counts.tolist(), op=MPI.SUM)
            grads[start:end] = self._scratch
        if not own:
            model.grads = grads

    def gather_parameters(self, model, rounding=True):
        """ZeRO-1: every rank's updated span into every rank's parameters (an all-gather). At
        bf16 the float32 master weights are gathered, and then (rounding) every rank rounds all
        of its bf16 parameters from them with the seed of the update, the AdamW t
        (Model.round_params(model.step)): the bits one process's update gives; a resume
        gathers without rounding (llmc/checkpoint.py)."""
        if self.comm is not None and self.zero_stage == 1:
            self._timed(self._gather_parameters, model)
            if rounding and model.step > 0:
                model.round_params(model.step)   # nothing to round at fp32

    def _gather_parameters(self, model):
        if self.on_device:
            _, master = model.collective_buffers()
            self._device(model.backend, "all_gather", master, model.num_parameters)
            model.backend.synchronize()
            return
        from mpi4py import MPI
        # model.params is the model's own memory where the backend's is the host's and the
        # parameters (or master weights) float32; else a copy: without master weights (-w 0)
        # the bf16 parameters widened, gathered, and loaded back exactly
        own = model.backend.host_visible and (model.master_weights or model.precision == "fp32")
        params = np.require(model.params, requirements="W")
        self.comm.Allgatherv(MPI.IN_PLACE, [params, self.shard_counts.tolist(),
                                            self.shard_offsets.tolist(), MPI.FLOAT])
        if not own:
            model.set_master_weights(params)   # at fp32: the parameters

    def grad_norm(self, model):
        """The global norm of the summed gradient: each rank's own shard under ZeRO-1, whose
        squares are summed across ranks (llm.c's gpt2_calculate_grad_norm)."""
        if self.zero_stage == 0:
            return model.grad_norm()
        return float(np.sqrt(self.sum(model.grad_norm(shard_only=True) ** 2)))

    def sum(self, value):
        """A float summed over all ranks (llm.c's multi_gpu_cpu_float_sum), in float64."""
        if self.comm is None:
            return value
        from mpi4py import MPI
        return self._timed(self.comm.allreduce, float(value), MPI.SUM)

    def mean(self, value):
        """A float averaged over all ranks (the loss, the val loss)."""
        return value if self.comm is None else self.sum(value) / self.num_processes

    def barrier(self):
        if self.comm is not None:
            self._timed(self.comm.Barrier)

    def abort(self, status):
        """End every process of the job now, with this exit status."""
        if self.comm is None:
            sys.exit(status)
        sys.stdout.flush()
        self.comm.Abort(status)


SINGLE = MultiProcessConfig()  # one process: every collective a no-op
_config = SINGLE  # this process's, once init() ran (fail() needs it)
_error_stream = None  # where errors go on a silenced rank (None: sys.stderr)


def init():
    """This process's MultiProcessConfig: MPI's COMM_WORLD when an MPI launcher started more
    than one process (mpi4py then required), else SINGLE. Silences ranks other than 0."""
    global _config, _error_stream
    if _config is not SINGLE:
        return _config
    size = launched_size()
    if size == 1:
        return SINGLE
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise DistributedError(f"started by an MPI launcher ({size or 'several'} processes) but "
                               f"mpi4py cannot be imported ({e}): pip install mpi4py mpich, "
                               f"and launch with that MPI's mpirun") from None
    comm = MPI.COMM_WORLD
    if size is not None and comm.Get_size() != size:
        raise DistributedError(f"the launcher started {size} processes but mpi4py's MPI sees "
                               f"{comm.Get_size()} ({MPI.Get_library_version().splitlines()[0]}"
                               f"): use the mpirun of the MPI that mpi4py runs on")
    if comm.Get_size() == 1:
        return SINGLE
    # this process's rank among those of its machine: the device it takes (accel/hip)
    os.environ[LOCAL_RANK_VARIABLE] = str(comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank())
    _config = MultiProcessConfig(comm)
    if _config.process_rank != 0:  # only rank 0 prints (llm.c's printf0), errors still do
        _error_stream = os.fdopen(os.dup(2), "w")
        devnull = os.open(os.devnull, os.O_WRONLY)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
    return _config


def fail(message, status):
    """Print the one-line error and end the job with status: sys.exit for one process; for
    many, MPI_Abort, so that no rank waits forever in a collective. A rank other than 0 waits
    ERROR_GRACE_S first: an error that every rank meets (a bad file) is then printed once, by
    rank 0, whose abort ends the others before they print."""
    sys.stdout.flush()
    if _config.process_rank != 0:
        time.sleep(ERROR_GRACE_S)
        message = f"{message} (rank {_config.process_rank})"
    print(message, file=_error_stream or sys.stderr, flush=True)
    _config.abort(status)


def abort_on_exception(exc):
    """For any other exception of a run of many processes: its traceback, then MPI_Abort.
    Returns (so that it is raised as usual) for one process or a clean exit."""
    if _config is SINGLE or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return
    if isinstance(exc, SystemExit):  # argparse: its message is printed already (by rank 0)
        _config.abort(exc.code if isinstance(exc.code, int) else 1)
    traceback.print_exception(exc, file=_error_stream or sys.stderr)
    (_error_stream or sys.stderr).flush()
    _config.abort(1)
