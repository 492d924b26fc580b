// accel/emu/emu_core.cpp — the emulator core: fibers, the block scheduler, fault reports.
//
// One scheduler per process, on the OS thread that calls launch(). Each GPU thread of the
// running block is a fiber with its own stack; it runs until it waits (barrier, warp
// collective) or exits, then control returns here, where the schedule picks the next one.
#include "emu_core.h"

#include <link.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__) || defined(EMU_UCONTEXT)
#include <ucontext.h>
#endif

namespace emu {

const ThreadContext* current_thread = nullptr;

Config& config() {
    static Config config = [] {
        Config c;
        if (const char* s = std::getenv("EMU_SCHEDULE"); s && !parse_schedule(s, c)) {
            std::fprintf(stderr, "emu: unknown EMU_SCHEDULE '%s'\n", s);
            std::exit(2);
        }
        if (const char* s = std::getenv("EMU_SEED")) c.seed = std::strtoull(s, nullptr, 10);
        if (const char* s = std::getenv("EMU_WARP_SIZE")) c.warp_size = std::atoi(s);
        if (const char* s = std::getenv("EMU_STACK_KB")) c.stack_bytes = std::strtoull(s, nullptr, 10) * 1024;
        if (const char* s = std::getenv("EMU_COMPUTE_UNITS")) c.compute_units = std::atoi(s);
        return c;
    }();
    return config;
}

bool parse_schedule(const std::string& name, Config& out) {
    static const struct { const char* name; Schedule schedule; bool reverse; } names[] = {
        {"lockstep", Schedule::lockstep, false},     {"lockstep-reverse", Schedule::lockstep, true},
        {"warp-ahead", Schedule::warp_ahead, false}, {"warp-ahead-reverse", Schedule::warp_ahead, true},
        {"shuffled", Schedule::shuffled, false},
    };
    for (const auto& n : names)
        if (name == n.name) {
            out.schedule = n.schedule;
            out.reverse = n.reverse;
            return true;
        }
    return false;
}

namespace {

// ---- context switch -----------------------------------------------------------------------

struct Stack {
    char* base = nullptr;  // lowest usable byte; a guard page lies below it
    size_t size = 0;
};

void fiber_main();

#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
// A hand-written switch: swapcontext makes a sigprocmask system call at every switch, which
// would dominate the run time of kernels with many barriers.
extern "C" void emu_switch_context(void** save_sp, void* load_sp);
extern "C" char emu_fiber_trampoline[];
asm(R"(
    .text
    .p2align 4
    .hidden emu_switch_context
emu_switch_context:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .hidden emu_fiber_trampoline
emu_fiber_trampoline:
    callq *%r13
    ud2
)");

struct Context {
    void* sp = nullptr;
};

void context_start(Context& c, const Stack& stack) {
    // The frame emu_switch_context pops: control word, mxcsr, r15..rbp, then the return into
    // the trampoline, which calls r13 with the stack 16-byte aligned as the ABI wants.
    auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack.base + stack.size) & ~uintptr_t(15));
    uint64_t* sp = top - 8;
    sp[0] = 0x1F80 | (uint64_t(0x037F) << 32);  // default mxcsr, x87 control word
    sp[1] = sp[2] = 0;                           // r15, r14
    sp[3] = reinterpret_cast<uint64_t>(&fiber_main);  // r13
    sp[4] = sp[5] = sp[6] = 0;                   // r12, rbx, rbp
    sp[7] = reinterpret_cast<uint64_t>(emu_fiber_trampoline);
    c.sp = sp;
}

void context_switch(Context& from, Context& to) { emu_switch_context(&from.sp, to.sp); }
#else
struct Context {
    ucontext_t uc;
};

void context_start(Context& c, const Stack& stack) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack.base;
    c.uc.uc_stack.ss_size = stack.size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, fiber_main, 0);
}

void context_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// ---- fibers -------------------------------------------------------------------------------

enum class State : uint8_t { runnable, at_barrier, at_warp_op, done };
enum class WarpOp : uint8_t { shuffle, ballot };

Stack allocate_stack(size_t size) {
    const size_t page = 4096;
    size = (size + page - 1) / page * page;
    void* p = mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        std::perror("emu: mmap of a fiber stack");
        std::abort();
    }
    mprotect(p, page, PROT_NONE);  // a stack overflow faults instead of corrupting a neighbour
    return {static_cast<char*>(p) + page, size};
}

struct Fiber {
    ThreadContext ctx;
    Context context;
    Stack stack;
    State state = State::done;
    // What it waits at.
    const char* op_name = nullptr;
    SourceLocation where{};
    WarpOp op{};
    uint64_t value = 0;
    int source_lane = 0;
    uint64_t result = 0;
    void* asan_fake_stack = nullptr;
};

struct Warp {
    int first = 0, lanes = 0;     // thread indices first .. first+lanes-1
    int arrived = 0, exited = 0;  // lanes waiting at a collective, lanes done
};

// ---- the scheduler's state ----------------------------------------------------------------

std::vector<Fiber> fibers;
std::vector<Warp> warps;
std::deque<int> ready;
int block_threads = 0, barrier_arrived = 0, block_exited = 0;
Fiber* running = nullptr;
Context scheduler_context;
const std::function<void()>* thread_body = nullptr;
const char* running_kernel = "";
std::mt19937_64 rng;
std::string error;
struct FreeMemory {
    void operator()(void* p) const { std::free(p); }
};
// malloc'ed at its exact size, so that AddressSanitizer sees accesses past it; 16-byte aligned.
std::unique_ptr<unsigned char, FreeMemory> dynamic_shared;
bool stacks_dirty = false;  // fibers were abandoned mid-run: their stacks keep ASan poison

#ifdef EMU_ASAN
void* scheduler_fake_stack = nullptr;
const void* scheduler_stack_bottom = nullptr;
size_t scheduler_stack_size = 0;
#endif

std::string format_dim(Dim3 d) {
    char s[64];
    std::snprintf(s, sizeof s, "(%u,%u,%u)", d.x, d.y, d.z);
    return s;
}

std::string format_location(SourceLocation w) { return std::string(w.file) + ":" + std::to_string(w.line); }

std::string format_thread(const Fiber& f) {
    return "thread " + format_dim(f.ctx.thread_index) + " (warp " + std::to_string(f.ctx.warp) + ", lane " +
           std::to_string(f.ctx.lane) + ")";
}

std::string format_wait(const Fiber& f) { return std::string(f.op_name) + " at " + format_location(f.where); }

void set_error(const std::string& what) {
    if (error.empty())
        error = "emu: kernel '" + std::string(running_kernel) + "' block " +
                format_dim(fibers[0].ctx.block_index) + ": " + what;
}

// Hands a batch of threads to the ready queue so that the schedule's pick order holds.
void make_ready(const std::vector<int>& threads) {
    const Config& c = config();
    auto in_order = [&](auto push) {
        if (c.reverse)
            for (auto it = threads.rbegin(); it != threads.rend(); ++it) push(*it);
        else
            for (int t : threads) push(t);
    };
    for (int t : threads) fibers[t].state = State::runnable;
    if (c.schedule == Schedule::warp_ahead) {
        // Popped from the back: the first thread in order ends up last, so its warp resumes first.
        std::vector<int> order;
        in_order([&](int t) { order.push_back(t); });
        for (auto it = order.rbegin(); it != order.rend(); ++it) ready.push_back(*it);
    } else {
        in_order([&](int t) { ready.push_back(t); });
    }
}

int next_ready() {
    const Schedule schedule = config().schedule;
    if (schedule == Schedule::lockstep) {
        const int t = ready.front();
        ready.pop_front();
        return t;
    }
    if (schedule == Schedule::shuffled)
        std::swap(ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(rng)], ready.back());
    const int t = ready.back();
    ready.pop_back();
    return t;
}

#ifdef EMU_ASAN
void asan_entered_fiber(Fiber& f) {
    __sanitizer_finish_switch_fiber(f.asan_fake_stack, &scheduler_stack_bottom, &scheduler_stack_size);
}
#else
void asan_entered_fiber(Fiber&) {}
#endif

void switch_to(Fiber& f) {
    running = &f;
    current_thread = &f.ctx;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&scheduler_fake_stack, f.stack.base, f.stack.size);
#endif
    context_switch(scheduler_context, f.context);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(scheduler_fake_stack, nullptr, nullptr);
#endif
    running = nullptr;
    current_thread = nullptr;
}

// From a fiber: back to the scheduler. `final` when this fiber will never resume.
void yield_to_scheduler(Fiber& f, bool final) {
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(final ? nullptr : &f.asan_fake_stack, scheduler_stack_bottom, scheduler_stack_size);
#else
    (void)final;
#endif
    context_switch(f.context, scheduler_context);
    asan_entered_fiber(f);
}

void fiber_main() {
    Fiber& f = *running;
    asan_entered_fiber(f);
    (*thread_body)();
    f.state = State::done;
    yield_to_scheduler(f, true);
    __builtin_unreachable();
}

Fiber& running_fiber(const char* what) {
    if (!running) {
        std::fprintf(stderr, "emu: %s called outside a kernel\n", what);
        std::abort();
    }
    return *running;
}

// ---- resolving barriers and collectives ---------------------------------------------------

const Fiber* first_in(int begin, int end, State s) {
    for (int t = begin; t < end; ++t)
        if (fibers[t].state == s) return &fibers[t];
    return nullptr;
}

bool same_wait(const Fiber& a, const Fiber& b) {
    return a.where.line == b.where.line && std::strcmp(a.where.file, b.where.file) == 0 &&
           std::strcmp(a.op_name, b.op_name) == 0;
}

void resolve_barrier() {
    if (barrier_arrived == 0 || barrier_arrived + block_exited < block_threads) return;
    const Fiber& waiter = *first_in(0, block_threads, State::at_barrier);
    if (block_exited > 0) {
        set_error(format_thread(*first_in(0, block_threads, State::done)) + " exited while " +
                  std::to_string(barrier_arrived) + " threads wait at " + format_wait(waiter) +
                  ": every thread of the block must reach each barrier");
        return;
    }
    for (int t = 0; t < block_threads; ++t)
        if (!same_wait(fibers[t], waiter)) {
            set_error("divergent barriers: " + format_thread(waiter) + " waits at " + format_wait(waiter) + ", " +
                      format_thread(fibers[t]) + " at " + format_wait(fibers[t]));
            return;
        }
    barrier_arrived = 0;
    std::vector<int> all(block_threads);
    for (int t = 0; t < block_threads; ++t) all[t] = t;
    make_ready(all);
}

void resolve_warp(Warp& w) {
    if (w.arrived == 0 || w.arrived + w.exited < w.lanes) return;
    const int end = w.first + w.lanes;
    const Fiber& waiter = *first_in(w.first, end, State::at_warp_op);
    if (w.exited > 0) {
        set_error(format_thread(*first_in(w.first, end, State::done)) + " exited while " + std::to_string(w.arrived) +
                  " lanes of its warp wait at " + format_wait(waiter) +
                  ": every lane of the warp must take part in a warp collective");
        return;
    }
    uint64_t ballot = 0;
    for (int t = w.first; t < end; ++t) {
        const Fiber& f = fibers[t];
        if (!same_wait(f, waiter)) {
            set_error("divergent warp collectives: " + format_thread(waiter) + " waits at " + format_wait(waiter) +
                      ", " + format_thread(f) + " at " + format_wait(f));
            return;
        }
        if (f.value) ballot |= uint64_t(1) << f.ctx.lane;
    }
    std::vector<int> lanes;
    for (int t = w.first; t < end; ++t) {
        Fiber& f = fibers[t];
        f.result = waiter.op == WarpOp::ballot ? ballot : fibers[w.first + f.source_lane].value;
        lanes.push_back(t);
    }
    w.arrived = 0;
    make_ready(lanes);
}

// No thread can run and the block is not finished: say what waits on what.
void report_stall() {
    for (const Warp& w : warps)
        if (w.arrived > 0) {
            const Fiber& lane = *first_in(w.first, w.first + w.lanes, State::at_warp_op);
            const Fiber& other = *first_in(w.first, w.first + w.lanes, State::at_barrier);
            set_error("deadlock: " + format_thread(lane) + " waits at " + format_wait(lane) + " while " +
                      format_thread(other) + " of the same warp waits at " + format_wait(other));
            return;
        }
    set_error("deadlock: no thread can run");
}

void after_yield(Fiber& f) {
    Warp& w = warps[f.ctx.warp];
    switch (f.state) {
    case State::at_barrier:
        ++barrier_arrived;
        resolve_barrier();
        break;
    case State::at_warp_op:
        ++w.arrived;
        resolve_warp(w);
        break;
    case State::done:
        ++block_exited;
        ++w.exited;
        resolve_warp(w);
        resolve_barrier();
        break;
    case State::runnable:
        break;
    }
}

// ---- running a block ----------------------------------------------------------------------

struct ByteRange {
    unsigned char* begin = nullptr;
    size_t size = 0;
};

// The calling OS thread's copy of the thread-local block that contains `anchor`.
ByteRange thread_local_block_of(const void* anchor) {
    struct Search {
        const unsigned char* anchor;
        ByteRange found;
    } search{static_cast<const unsigned char*>(anchor), {}};
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* data) {
            auto& s = *static_cast<Search*>(data);
            auto* tls = static_cast<unsigned char*>(info->dlpi_tls_data);
            if (!tls) return 0;
            for (int i = 0; i < info->dlpi_phnum; ++i)
                if (info->dlpi_phdr[i].p_type == PT_TLS && s.anchor >= tls &&
                    s.anchor < tls + info->dlpi_phdr[i].p_memsz) {
                    s.found = {tls, size_t(info->dlpi_phdr[i].p_memsz)};
                    return 1;
                }
            return 0;
        },
        &search);
    return search.found;
}

void prepare_fibers(int count) {
    const size_t stack_bytes = config().stack_bytes;
    if (!fibers.empty() && fibers[0].stack.size < stack_bytes) {
        for (Fiber& f : fibers) munmap(f.stack.base - 4096, f.stack.size + 4096);
        fibers.clear();
    }
    while (int(fibers.size()) < count) {
        fibers.emplace_back();
        fibers.back().stack = allocate_stack(stack_bytes);
    }
#ifdef EMU_ASAN
    if (stacks_dirty)
        for (Fiber& f : fibers) ASAN_UNPOISON_MEMORY_REGION(f.stack.base, f.stack.size);
#endif
    stacks_dirty = false;
}

void run_block(Dim3 grid, Dim3 block, Dim3 block_index, ByteRange shared, size_t dynamic_shared_bytes) {
    const int warp_size = config().warp_size;
    std::memset(shared.begin, 0xFF, shared.size);
    std::memset(dynamic_shared.get(), 0xFF, dynamic_shared_bytes);
    for (int t = 0; t < block_threads; ++t) {
        Fiber& f = fibers[t];
        f.ctx = {{t % block.x, t / block.x % block.y, t / (block.x * block.y)}, block_index, block, grid, t,
                 t % warp_size, t / warp_size};
        context_start(f.context, f.stack);
        f.asan_fake_stack = nullptr;
    }
    warps.assign((block_threads + warp_size - 1) / warp_size, Warp{});
    for (size_t w = 0; w < warps.size(); ++w) {
        warps[w].first = int(w) * warp_size;
        warps[w].lanes = std::min(warp_size, block_threads - warps[w].first);
    }
    barrier_arrived = block_exited = 0;
    ready.clear();
    std::vector<int> all(block_threads);
    for (int t = 0; t < block_threads; ++t) all[t] = t;
    make_ready(all);
    while (error.empty()) {
        if (ready.empty()) {
            if (block_exited < block_threads) report_stall();
            break;
        }
        Fiber& f = fibers[next_ready()];
        switch_to(f);
        if (error.empty()) after_yield(f);
    }
    if (!error.empty()) stacks_dirty = true;
}

std::string check_launch(Dim3 grid, Dim3 block, int warp_size) {
    const unsigned long threads = (unsigned long)block.x * block.y * block.z;
    if (threads == 0 || threads > 1024) return "a block of " + std::to_string(threads) + " threads (1 to 1024)";
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535)
        return "grid " + format_dim(grid) + " (x >= 1, y and z 1 to 65535)";
    if (warp_size < 1 || warp_size > 64 || (warp_size & (warp_size - 1)))
        return "warp size " + std::to_string(warp_size) + " (a power of two up to 64)";
    return "";
}

}  // namespace

bool launch(const char* kernel_name, Dim3 grid, Dim3 block, size_t dynamic_shared_bytes, const void* shared_anchor,
            const std::function<void()>& body) {
    running_kernel = kernel_name;
    error.clear();
    const Config& c = config();
    const ByteRange shared = thread_local_block_of(shared_anchor);
    std::string bad = check_launch(grid, block, c.warp_size);
    if (bad.empty() && !shared.begin) bad = "no thread-local block holds the shared-memory anchor";
    if (!bad.empty()) {
        error = "emu: kernel '" + std::string(kernel_name) + "': invalid launch: " + bad;
        std::fprintf(stderr, "%s\n", error.c_str());
        return false;
    }
    block_threads = int(block.x * block.y * block.z);
    prepare_fibers(block_threads);
    thread_body = &body;
    dynamic_shared.reset(static_cast<unsigned char*>(std::malloc(dynamic_shared_bytes)));
    rng.seed(c.seed);

    const unsigned long blocks = (unsigned long)grid.x * grid.y * grid.z;
    std::vector<unsigned long> order(blocks);
    for (unsigned long b = 0; b < blocks; ++b) order[b] = b;
    if (c.schedule == Schedule::shuffled) std::shuffle(order.begin(), order.end(), rng);
    if (c.reverse) std::reverse(order.begin(), order.end());
    for (unsigned long b : order) {
        const Dim3 block_index{unsigned(b % grid.x), unsigned(b / grid.x % grid.y), unsigned(b / (grid.x * grid.y))};
        run_block(grid, block, block_index, shared, dynamic_shared_bytes);
        if (!error.empty()) break;
    }
    dynamic_shared.reset();
    thread_body = nullptr;
    if (!error.empty()) std::fprintf(stderr, "%s\n", error.c_str());
    return error.empty();
}

const std::string& last_error() { return error; }
void clear_error() { error.clear(); }

void* dynamic_shared_memory() {
    running_fiber("dynamic shared memory");
    return dynamic_shared.get();
}

void barrier(const char* name, SourceLocation where) {
    Fiber& f = running_fiber(name);
    f.op_name = name;
    f.where = where;
    f.state = State::at_barrier;
    yield_to_scheduler(f, false);
}

namespace {
uint64_t warp_collective(WarpOp op, uint64_t value, int source_lane, const char* name, SourceLocation where) {
    Fiber& f = running_fiber(name);
    f.op = op;
    f.value = value;
    f.source_lane = source_lane;
    f.op_name = name;
    f.where = where;
    f.state = State::at_warp_op;
    yield_to_scheduler(f, false);
    return f.result;
}
}  // namespace

uint64_t warp_shuffle(uint64_t value, int source_lane, const char* name, SourceLocation where) {
    const Fiber& f = running_fiber(name);
    const int lanes = warps[f.ctx.warp].lanes;
    if (source_lane < 0 || source_lane >= lanes)
        fail(std::string(name) + " reads lane " + std::to_string(source_lane) + ", which does not exist (its warp has " +
                 std::to_string(lanes) + " lanes)",
             where);
    return warp_collective(WarpOp::shuffle, value, source_lane, name, where);
}

uint64_t warp_ballot(bool predicate, const char* name, SourceLocation where) {
    return warp_collective(WarpOp::ballot, predicate, 0, name, where);
}

uint64_t warp_lanes_mask() {
    const int lanes = warps[running_fiber("a warp query").ctx.warp].lanes;
    return lanes == 64 ? ~uint64_t(0) : (uint64_t(1) << lanes) - 1;
}

void fail(const std::string& what, SourceLocation where) {
    Fiber& f = running_fiber(what.c_str());
    set_error(format_thread(f) + ": " + what + " at " + format_location(where));
    f.state = State::done;
    yield_to_scheduler(f, true);
    __builtin_unreachable();
}

}  // namespace emu
