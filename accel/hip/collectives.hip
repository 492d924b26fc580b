/*
accel/hip/collectives.hip — the table's collectives group (accel/spec.py): many processes, one
device each, summing and gathering float32 buffers in device memory through RCCL (AMD) or NCCL
(NVIDIA, RCCL's names through accel/hip/cuda/rccl/rccl.h), as llm.c's zero.cuh does. Included
by gpt2.hip, after its Context; built into each library unless ACCEL_HIP_NO_COLLECTIVES (a GPU
build where no NCCL/RCCL was found: the library then lacks these symbols and device.pyx leaves
the group out, so many processes go through host copies). The emulated build links
accel/emu/rccl, each rank a process of its own.

The communicator is set up as llm.c's: rank 0 makes the unique id (comm_unique_id), MPI sends it
to every rank (llmc/distributed.py), each joins with it (comm_init). Every collective is in
place on a buffer of n floats cut into the ranks' balanced spans (rank r: n / N elements, one
more for the first n % N ranks, back to back: llmc/distributed.py's shards). Where the spans are
equal, ZeRO-1's reduce-scatter and all-gather are NCCL's own; else a group of one ncclReduce or
ncclBroadcast per rank, rooted at the span's rank (NCCL's way to a collective with unequal
counts). All run on the stream the kernels run on (0), so they are ordered with them.
*/
#ifndef ACCEL_HIP_NO_COLLECTIVES
#include <rccl/rccl.h>

#include <cstring>
#include <map>

namespace {

struct Communicator {
    ncclComm_t comm = nullptr;
    int rank = 0, nranks = 1;
};

// each context's communicator (at most one: comm_init), until the context is destroyed
std::map<const Context*, Communicator>& communicators() {
    static std::map<const Context*, Communicator> of;
    return of;
}

bool nccl_ok(Context* c, ncclResult_t result, ncclComm_t comm, const char* where) {
    if (result == ncclSuccess) return true;
    if (c->error.empty()) {
        c->error = std::string(where) + ": " + ncclGetErrorString(result);
#if NCCL_VERSION_CODE >= 21300  // ncclGetLastError: what failed, in the library's words
        const char* detail = ncclGetLastError(comm);
        if (detail && *detail) c->error += std::string(" (") + detail + ")";
#endif
    }
    return false;
}

// The context's communicator, or NULL with the error set.
const Communicator* communicator(Context* c, const char* where) {
    auto found = communicators().find(c);
    if (found != communicators().end()) return &found->second;
    if (c->error.empty()) c->error = std::string(where) + ": no communicator (comm_init first)";
    return nullptr;
}

// rank r's span of n elements: [first, first + count)
struct Span {
    long first, count;
};

Span span_of(long n, int r, int nranks) {
    const long base = n / nranks, extra = n % nranks;
    return {r * base + std::min<long>(r, extra), base + (r < extra)};
}

// Called by accel_hip_destroy: the context's communicator goes with it.
void release_communicator(Context* c) {
    auto found = communicators().find(c);
    if (found == communicators().end()) return;
    (void)ncclCommDestroy(found->second.comm);
    communicators().erase(found);
}

}  // namespace

ACCEL_HIP_API void accel_hip_comm_unique_id(void* ctx, void* unique_id) {
    ncclUniqueId id;
    if (nccl_ok(context(ctx), ncclGetUniqueId(&id), nullptr, "comm_unique_id")) std::memcpy(unique_id, &id, sizeof id);
}

ACCEL_HIP_API void accel_hip_comm_init(void* ctx, const void* unique_id, int rank, int nranks) {
    Context* c = context(ctx);
    if (communicators().count(c)) {
        if (c->error.empty()) c->error = "comm_init: this context has a communicator already";
        return;
    }
    ncclUniqueId id;
    std::memcpy(&id, unique_id, sizeof id);
    Communicator made;
    made.rank = rank;
    made.nranks = nranks;
    if (nccl_ok(c, ncclCommInitRank(&made.comm, nranks, id, rank), nullptr, "comm_init")) communicators()[c] = made;
}

ACCEL_HIP_API void accel_hip_all_reduce_sum(void* ctx, float* x, ptrdiff_t n) {
    Context* c = context(ctx);
    const Communicator* m = communicator(c, "all_reduce_sum");
    if (m) nccl_ok(c, ncclAllReduce(x, x, size_t(n), ncclFloat32, ncclSum, m->comm, 0), m->comm, "all_reduce_sum");
}

ACCEL_HIP_API void accel_hip_reduce_scatter_sum(void* ctx, float* x, ptrdiff_t n) {
    Context* c = context(ctx);
    const Communicator* m = communicator(c, "reduce_scatter_sum");
    if (!m) return;
    if (n % m->nranks == 0) {  // rank r's span is block r: in place
        const Span own = span_of(n, m->rank, m->nranks);
        nccl_ok(c, ncclReduceScatter(x, x + own.first, size_t(own.count), ncclFloat32, ncclSum, m->comm, 0), m->comm,
                "reduce_scatter_sum");
        return;
    }
    if (!nccl_ok(c, ncclGroupStart(), m->comm, "reduce_scatter_sum")) return;
    for (int r = 0; r < m->nranks; ++r) {
        const Span s = span_of(n, r, m->nranks);
        nccl_ok(c, ncclReduce(x + s.first, x + s.first, size_t(s.count), ncclFloat32, ncclSum, r, m->comm, 0), m->comm,
                "reduce_scatter_sum");
    }
    nccl_ok(c, ncclGroupEnd(), m->comm, "reduce_scatter_sum");
}

ACCEL_HIP_API void accel_hip_all_gather(void* ctx, float* x, ptrdiff_t n) {
    Context* c = context(ctx);
    const Communicator* m = communicator(c, "all_gather");
    if (!m) return;
    if (n % m->nranks == 0) {
        const Span own = span_of(n, m->rank, m->nranks);
        nccl_ok(c, ncclAllGather(x + own.first, x, size_t(own.count), ncclFloat32, m->comm, 0), m->comm, "all_gather");
        return;
    }
    if (!nccl_ok(c, ncclGroupStart(), m->comm, "all_gather")) return;
    for (int r = 0; r < m->nranks; ++r) {
        const Span s = span_of(n, r, m->nranks);
        nccl_ok(c, ncclBroadcast(x + s.first, x + s.first, size_t(s.count), ncclFloat32, r, m->comm, 0), m->comm,
                "all_gather");
    }
    nccl_ok(c, ncclGroupEnd(), m->comm, "all_gather");
}

#else
namespace {
void release_communicator(Context*) {}
}  // namespace
#endif
