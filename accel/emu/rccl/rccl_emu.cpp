// accel/emu/rccl/rccl_emu.cpp — RCCL's (NCCL's) collectives on the CPU, for the emulated build
// of accel/hip: each rank is a process of its own (mpirun -np N, each loading the emulated
// library), "device" memory is host memory, and the ranks of a communicator meet in a POSIX
// shared memory object named in the unique id.
//
// The object holds a header (the ranks' pids, a barrier counter) and one slot of CHUNK floats
// per rank. A collective goes through its buffer CHUNK elements at a time: every rank copies
// its chunk into its slot, all wait at the barrier, the ranks that receive read the slots, all
// wait again. A sum adds the slots in rank order (slot 0 + slot 1 + ...), so every receiving
// rank gets the same float32 bits whatever order the ranks arrive in, run after run.
//
// Calls run at once, in the calling thread (streams are synchronous in the emulator; a group,
// ncclGroupStart/End, changes nothing: every rank issues the same calls in the same order).
// A rank that waits checks, every WATCH_MS, that the ranks that joined are still alive: one that
// ended makes the call fail with ncclRemoteError and a message naming it (ncclGetLastError),
// instead of a wait without end. A rank that ends before it joins is not seen (its pid is not
// known yet): the launcher, mpirun, ends the job then.
// The emulation sums float32 only (ncclFloat32, ncclSum): what accel/hip asks of it.
#include "rccl/rccl.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <random>
#include <signal.h>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace {

constexpr size_t CHUNK = size_t(1) << 18;  // floats per rank's slot: 1 MiB
constexpr int MAX_RANKS = 256;
constexpr uint64_t ID_MAGIC = 0x6c6c6d7079786363ull;     // "llmpyxcc": a unique id of ours
constexpr uint32_t READY = 0x72636c65u;                   // the header is set up
constexpr int WATCH_MS = 100;

static_assert(std::atomic<uint64_t>::is_always_lock_free, "the barrier needs lock-free 64-bit atomics");

// What ncclGetUniqueId writes: the shared memory object's name.
struct Id {
    uint64_t magic;
    char name[NCCL_UNIQUE_ID_BYTES - sizeof(uint64_t)];
};
static_assert(sizeof(Id) == sizeof(ncclUniqueId), "the unique id is NCCL's 128 bytes");

// The start of the shared memory object; the slots follow it.
struct Header {
    std::atomic<uint32_t> ready;
    std::atomic<uint64_t> arrivals;  // barrier arrivals since the start, of all ranks
    std::atomic<int32_t> pids[MAX_RANKS];
};

size_t object_bytes(int nranks) { return sizeof(Header) + size_t(nranks) * CHUNK * sizeof(float); }

// Whether process pid has ended (a zombie, ended but not reaped, counts as ended).
bool ended(pid_t pid) {
    if (kill(pid, 0) != 0) return errno == ESRCH;
    char path[64], stat[256] = {};
    std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
    FILE* f = std::fopen(path, "r");
    if (!f) return false;
    const size_t got = std::fread(stat, 1, sizeof stat - 1, f);
    std::fclose(f);
    const char* close = std::strrchr(stat, ')');  // "pid (name) S ...": the state after the name
    return got && close && close[1] == ' ' && close[2] == 'Z';
}

}  // namespace

struct ncclComm {
    Header* header = nullptr;
    float* slots = nullptr;  // (nranks, CHUNK)
    size_t bytes = 0;
    int rank = 0, nranks = 1;
    uint64_t barriers = 0;  // barriers this rank has passed
    std::string error;      // the last failure, for ncclGetLastError
    bool broken = false;    // a rank ended: every later call fails

    ncclResult_t fail(ncclResult_t result, const std::string& why) {
        error = why;
        if (result == ncclRemoteError) broken = true;
        return result;
    }

    // Wait until every rank has arrived at this barrier; a rank that joined and ended fails it.
    ncclResult_t barrier() {
        const uint64_t target = (++barriers) * uint64_t(nranks);
        header->arrivals.fetch_add(1, std::memory_order_acq_rel);
        auto watched = std::chrono::steady_clock::now();
        for (unsigned spins = 0; header->arrivals.load(std::memory_order_acquire) < target; ++spins) {
            if (spins < 1000) {
                std::this_thread::yield();
                continue;
            }
            std::this_thread::sleep_for(std::chrono::microseconds(50));
            if (std::chrono::steady_clock::now() - watched < std::chrono::milliseconds(WATCH_MS)) continue;
            watched = std::chrono::steady_clock::now();
            for (int r = 0; r < nranks; ++r) {
                const pid_t pid = header->pids[r].load();
                if (pid != 0 && r != rank && ended(pid))
                    return fail(ncclRemoteError, "rank " + std::to_string(r) + " (pid " + std::to_string(pid) +
                                                     ") of the communicator ended while rank " +
                                                     std::to_string(rank) + " waited for it");
            }
        }
        return ncclSuccess;
    }

    float* slot(int r) { return slots + size_t(r) * CHUNK; }

    ncclResult_t check(ncclDataType_t type, const char* what) {
        if (broken) return ncclRemoteError;  // error still says which rank ended
        if (type != ncclFloat32) return fail(ncclInvalidArgument, std::string(what) + ": the emulated RCCL sums float32 only");
        return ncclSuccess;
    }

    // recv (on root, or on every rank with root -1) = the sum over the ranks of their send, in
    // rank order; recv may be send (in place) and NULL off the root.
    ncclResult_t reduce(const float* send, float* recv, size_t count, int root) {
        for (size_t first = 0; first < count; first += CHUNK) {
            const size_t n = std::min(CHUNK, count - first);
            std::memcpy(slot(rank), send + first, n * sizeof(float));
            if (ncclResult_t e = barrier()) return e;
            if (root < 0 || root == rank) {
                float* out = recv + first;
                std::memcpy(out, slot(0), n * sizeof(float));
                for (int r = 1; r < nranks; ++r) {
                    const float* in = slot(r);
                    for (size_t i = 0; i < n; ++i) out[i] += in[i];
                }
            }
            if (ncclResult_t e = barrier()) return e;  // the slots are read before they are reused
        }
        return ncclSuccess;
    }

    // recv on every rank = root's send (in place where recv is send).
    ncclResult_t broadcast(const float* send, float* recv, size_t count, int root) {
        for (size_t first = 0; first < count; first += CHUNK) {
            const size_t n = std::min(CHUNK, count - first);
            if (rank == root) std::memcpy(slot(0), send + first, n * sizeof(float));
            if (ncclResult_t e = barrier()) return e;
            if (rank != root || recv != send) std::memcpy(recv + first, slot(0), n * sizeof(float));
            if (ncclResult_t e = barrier()) return e;
        }
        return ncclSuccess;
    }
};

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
    static std::atomic<unsigned> made{0};
    Id id{};
    id.magic = ID_MAGIC;
    std::random_device random;
    std::snprintf(id.name, sizeof id.name, "/llmpyx-rccl-emu-%d-%u-%08x", int(getpid()), made++, unsigned(random()));
    std::memcpy(unique_id, &id, sizeof id);
    return ncclSuccess;
}

// Every rank opens the object (the first creates and sizes it), says its pid and waits for the
// others at a barrier; then rank 0 unlinks the name, so that nothing is left in /dev/shm (but by
// a job killed while its ranks join: /dev/shm/llmpyx-rccl-emu-*, which may be removed).
ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId unique_id, int rank) {
    *out = nullptr;
    Id id;
    std::memcpy(&id, &unique_id, sizeof id);
    if (id.magic != ID_MAGIC || !std::memchr(id.name, 0, sizeof id.name)) return ncclInvalidArgument;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    const size_t bytes = object_bytes(nranks);
    bool created = true;
    int fd = shm_open(id.name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno == EEXIST) {
        created = false;
        fd = shm_open(id.name, O_RDWR, 0600);
    }
    if (fd < 0) return ncclSystemError;
    if (created && ftruncate(fd, off_t(bytes)) != 0) {
        close(fd);
        return ncclSystemError;
    }
    struct stat st;
    while (fstat(fd, &st) == 0 && st.st_size == 0)  // the creator is sizing it (in one step)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (size_t(st.st_size) != bytes) {  // sized for another number of ranks
        close(fd);
        return ncclInvalidUsage;
    }
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return ncclSystemError;
    ncclComm* comm = new ncclComm;
    comm->header = static_cast<Header*>(base);
    comm->slots = reinterpret_cast<float*>(static_cast<char*>(base) + sizeof(Header));
    comm->bytes = bytes;
    comm->rank = rank;
    comm->nranks = nranks;
    // a new object is zero-filled: counters at 0, no pids; the creator marks it ready
    if (created) comm->header->ready.store(READY, std::memory_order_release);
    while (comm->header->ready.load(std::memory_order_acquire) != READY)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    int32_t no_pid = 0;
    if (!comm->header->pids[rank].compare_exchange_strong(no_pid, int32_t(getpid()))) {
        munmap(base, bytes);
        delete comm;
        return ncclInvalidUsage;  // two processes joined as the same rank
    }
    const ncclResult_t joined = comm->barrier();
    if (rank == 0 || joined != ncclSuccess) shm_unlink(id.name);
    if (joined != ncclSuccess) {
        munmap(base, bytes);
        delete comm;
        return joined;
    }
    *out = comm;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm) {
        munmap(comm->header, comm->bytes);
        delete comm;
    }
    return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error (the emulated RCCL's shared memory)";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    default: return "unknown result code";
    }
}

const char* ncclGetLastError(ncclComm_t comm) { return comm ? comm->error.c_str() : ""; }

ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t,
                           ncclComm_t comm, hipStream_t) {
    if (ncclResult_t e = comm->check(type, "ncclAllReduce")) return e;
    return comm->reduce(static_cast<const float*>(send), static_cast<float*>(recv), count, -1);
}

// rank r receives the sum of block r (recvcount elements) of every rank's send
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type, ncclRedOp_t,
                               ncclComm_t comm, hipStream_t) {
    if (ncclResult_t e = comm->check(type, "ncclReduceScatter")) return e;
    for (int r = 0; r < comm->nranks; ++r)
        if (ncclResult_t e = comm->reduce(static_cast<const float*>(send) + size_t(r) * recvcount,
                                          static_cast<float*>(recv), recvcount, r))
            return e;
    return ncclSuccess;
}

// block r (sendcount elements) of every rank's recv is rank r's send
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           hipStream_t) {
    if (ncclResult_t e = comm->check(type, "ncclAllGather")) return e;
    float* blocks = static_cast<float*>(recv);
    for (int r = 0; r < comm->nranks; ++r)
        if (ncclResult_t e = comm->broadcast(static_cast<const float*>(send), blocks + size_t(r) * sendcount,
                                             sendcount, r))
            return e;
    return ncclSuccess;
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t, int root,
                        ncclComm_t comm, hipStream_t) {
    if (ncclResult_t e = comm->check(type, "ncclReduce")) return e;
    if (root < 0 || root >= comm->nranks) return comm->fail(ncclInvalidArgument, "ncclReduce: no such root");
    return comm->reduce(static_cast<const float*>(send), static_cast<float*>(recv), count, root);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, hipStream_t) {
    if (ncclResult_t e = comm->check(type, "ncclBroadcast")) return e;
    if (root < 0 || root >= comm->nranks) return comm->fail(ncclInvalidArgument, "ncclBroadcast: no such root");
    return comm->broadcast(static_cast<const float*>(send), static_cast<float*>(recv), count, root);
}

}  // extern "C"
