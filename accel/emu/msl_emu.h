// accel/emu/msl_emu.h — Metal Shading Language front-end of the CPU emulator: the MSL types and
// functions a kernel file uses, for g++, running on the emulator core (emu_core.h).
//
// A .metal file is not C++: msl_rewrite.py turns it into C++ line for line (address spaces,
// parameter attributes, `threadgroup` variables, kernel registration), keeping its
// `#include <metal_stdlib>`, which `-I accel/emu/include` resolves to this header. The rewritten
// file registers each kernel with emu_msl::registry(); msl_runtime.cpp dispatches them.
//
// Simdgroups are the core's warps: 32 lanes unless EMU_WARP_SIZE says otherwise (Apple GPUs
// have 32; a kernel that reads [[threads_per_simdgroup]] also runs at 64, as AMD Macs have).
#pragma once

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>

#include "emu_core.h"
#include "msl_half.h"

// ---- scalar and vector types (global, as MSL has them) ------------------------------------

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;

namespace emu_msl {

// An MSL vector: elements x, y, z, w; a 3-vector takes the room of a 4-vector, as in MSL.
template <class T, int N>
struct vec;

template <class T>
struct alignas(sizeof(T) * 2) vec<T, 2> {
    T x, y;
    vec() : x(), y() {}
    vec(T s) : x(s), y(s) {}
    vec(T x_, T y_) : x(x_), y(y_) {}
    template <class U>
    explicit vec(const vec<U, 2>& v) : x(T(v.x)), y(T(v.y)) {}
    T& operator[](int i) { return (&x)[i]; }
    const T& operator[](int i) const { return (&x)[i]; }
};

template <class T>
struct alignas(sizeof(T) * 4) vec<T, 3> {
    T x, y, z;
    vec() : x(), y(), z() {}
    vec(T s) : x(s), y(s), z(s) {}
    vec(T x_, T y_, T z_) : x(x_), y(y_), z(z_) {}
    template <class U>
    explicit vec(const vec<U, 3>& v) : x(T(v.x)), y(T(v.y)), z(T(v.z)) {}
    T& operator[](int i) { return (&x)[i]; }
    const T& operator[](int i) const { return (&x)[i]; }
};

template <class T>
struct alignas(sizeof(T) * 4) vec<T, 4> {
    T x, y, z, w;
    vec() : x(), y(), z(), w() {}
    vec(T s) : x(s), y(s), z(s), w(s) {}
    vec(T x_, T y_, T z_, T w_) : x(x_), y(y_), z(z_), w(w_) {}
    template <class U>
    explicit vec(const vec<U, 4>& v) : x(T(v.x)), y(T(v.y)), z(T(v.z)), w(T(v.w)) {}
    T& operator[](int i) { return (&x)[i]; }
    const T& operator[](int i) const { return (&x)[i]; }
};

#define EMU_MSL_VEC_OP(op)                                                          \
    template <class T, int N>                                                       \
    vec<T, N> operator op(const vec<T, N>& a, const vec<T, N>& b) {                 \
        vec<T, N> r;                                                                \
        for (int i = 0; i < N; ++i) r[i] = a[i] op b[i];                            \
        return r;                                                                   \
    }                                                                               \
    template <class T, int N, class S, class = std::enable_if_t<std::is_arithmetic_v<S> || emu_msl::is_msl_float<S>>> \
    vec<T, N> operator op(const vec<T, N>& a, S s) {                                \
        return a op vec<T, N>(T(s));                                                \
    }                                                                               \
    template <class T, int N, class S, class = std::enable_if_t<std::is_arithmetic_v<S> || emu_msl::is_msl_float<S>>> \
    vec<T, N> operator op(S s, const vec<T, N>& a) {                                \
        return vec<T, N>(T(s)) op a;                                                \
    }                                                                               \
    template <class T, int N, class R>                                              \
    vec<T, N>& operator op##=(vec<T, N>& a, const R& b) {                           \
        return a = a op b;                                                          \
    }
EMU_MSL_VEC_OP(+)
EMU_MSL_VEC_OP(-)
EMU_MSL_VEC_OP(*)
EMU_MSL_VEC_OP(/)
#undef EMU_MSL_VEC_OP

template <class T, int N>
vec<T, N> operator-(const vec<T, N>& a) {
    return a * T(-1);
}

// ---- dispatch state: what the attributes of a running thread read -------------------------

struct Dispatch {
    void* const* args = nullptr;  // [[buffer(n)]]: args[n] points at the buffer or the bytes
    int num_args = 0;
    emu::Dim3 threads_per_grid;       // the grid in threads
    emu::Dim3 threads_per_threadgroup;  // the nominal threadgroup size
    emu::Dim3 group_offset;           // threadgroup position of the running launch's first group
    const size_t* threadgroup_offsets = nullptr;  // [[threadgroup(n)]]: offset of n in the dynamic block
    int num_threadgroup_args = 0;
};

// The dispatch running now (valid inside a kernel).
extern const Dispatch* current_dispatch;

[[noreturn]] inline void fail_here(const std::string& what) { emu::fail(what, {"(kernel arguments)", 0}); }

// A [[buffer(n)]] parameter of type T (a pointer, or a reference to constant data).
template <class T>
T buffer_arg(int n) {
    const Dispatch& d = *current_dispatch;
    if (n >= d.num_args || !d.args[n]) fail_here("no argument bound at [[buffer(" + std::to_string(n) + ")]]");
    if constexpr (std::is_pointer_v<T>)
        return static_cast<T>(d.args[n]);
    else
        return *static_cast<std::remove_reference_t<T>*>(d.args[n]);
}

// A [[threadgroup(n)]] parameter: a slice of the dynamic threadgroup memory.
template <class T>
T threadgroup_arg(int n) {
    const Dispatch& d = *current_dispatch;
    if (n >= d.num_threadgroup_args)
        fail_here("no threadgroup memory length set for [[threadgroup(" + std::to_string(n) + ")]]");
    return reinterpret_cast<T>(static_cast<char*>(emu::dynamic_shared_memory()) + d.threadgroup_offsets[n]);
}

// The thread-position attributes, as the parameter's type (uint, uint2 or uint3, or ushort...).
template <class T>
T position(emu::Dim3 d) {
    if constexpr (std::is_arithmetic_v<T>)
        return T(d.x);
    else if constexpr (sizeof(T) / sizeof(T{}.x) == 2)
        return T(decltype(T{}.x)(d.x), decltype(T{}.x)(d.y));
    else
        return T(decltype(T{}.x)(d.x), decltype(T{}.x)(d.y), decltype(T{}.x)(d.z));
}

inline emu::Dim3 threadgroup_position_in_grid() {
    const emu::Dim3 b = emu::current_thread->block_index, o = current_dispatch->group_offset;
    return {b.x + o.x, b.y + o.y, b.z + o.z};
}
inline emu::Dim3 thread_position_in_grid() {
    const emu::Dim3 g = threadgroup_position_in_grid(), n = current_dispatch->threads_per_threadgroup,
                    t = emu::current_thread->thread_index;
    return {g.x * n.x + t.x, g.y * n.y + t.y, g.z * n.z + t.z};
}
inline emu::Dim3 threadgroups_per_grid() {
    const emu::Dim3 g = current_dispatch->threads_per_grid, n = current_dispatch->threads_per_threadgroup;
    return {(g.x + n.x - 1) / n.x, (g.y + n.y - 1) / n.y, (g.z + n.z - 1) / n.z};
}
inline emu::Dim3 scalar(unsigned v) { return {v, 0, 0}; }

// The attributes by name, as the rewrite spells them.
#define EMU_MSL_ATTR_thread_position_in_grid ::emu_msl::thread_position_in_grid()
#define EMU_MSL_ATTR_thread_position_in_threadgroup (::emu::current_thread->thread_index)
#define EMU_MSL_ATTR_threadgroup_position_in_grid ::emu_msl::threadgroup_position_in_grid()
#define EMU_MSL_ATTR_threads_per_threadgroup (::emu::current_thread->block_dim)
#define EMU_MSL_ATTR_threads_per_grid (::emu_msl::current_dispatch->threads_per_grid)
#define EMU_MSL_ATTR_threadgroups_per_grid ::emu_msl::threadgroups_per_grid()
#define EMU_MSL_ATTR_thread_index_in_threadgroup ::emu_msl::scalar(::emu::current_thread->linear_index)
#define EMU_MSL_ATTR_thread_index_in_simdgroup ::emu_msl::scalar(::emu::current_thread->lane)
#define EMU_MSL_ATTR_simdgroup_index_in_threadgroup ::emu_msl::scalar(::emu::current_thread->warp)
#define EMU_MSL_ATTR_threads_per_simdgroup ::emu_msl::scalar(::emu::config().warp_size)
#define EMU_MSL_ATTR_simdgroups_per_threadgroup                                                         \
    ::emu_msl::scalar((::emu::current_thread->block_dim.x * ::emu::current_thread->block_dim.y *          \
                           ::emu::current_thread->block_dim.z +                                           \
                       ::emu::config().warp_size - 1) /                                                   \
                      ::emu::config().warp_size)

// ---- kernel registry ----------------------------------------------------------------------

using Launcher = void (*)();  // runs the kernel in the current thread with current_dispatch's arguments

struct Kernel {
    const char* name;
    Launcher run;
    const char* file;
    int line;
};

std::map<std::string, Kernel>& registry();

struct Registration {
    Registration(const char* name, Launcher run, const char* file, int line) {
        registry()[name] = Kernel{name, run, file, line};
    }
};

}  // namespace emu_msl

using float2 = emu_msl::vec<float, 2>;
using float3 = emu_msl::vec<float, 3>;
using float4 = emu_msl::vec<float, 4>;
using half2 = emu_msl::vec<half, 2>;
using half4 = emu_msl::vec<half, 4>;
using int2 = emu_msl::vec<int, 2>;
using int3 = emu_msl::vec<int, 3>;
using int4 = emu_msl::vec<int, 4>;
using uint2 = emu_msl::vec<uint, 2>;
using uint3 = emu_msl::vec<uint, 3>;
using uint4 = emu_msl::vec<uint, 4>;
using ushort2 = emu_msl::vec<ushort, 2>;
using ulong2 = emu_msl::vec<ulong, 2>;
using ushort3 = emu_msl::vec<ushort, 3>;
// MSL's packed_float3 is three floats, 12 bytes.
struct packed_float3 {
    float x, y, z;
};

// ---- the metal namespace: math, synchronization, simdgroup functions, atomics -------------

namespace metal {

// mem_flags only say which memory a barrier orders; the emulator orders all of it.
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

#define EMU_MSL_HERE (::emu::SourceLocation{__FILE__, __LINE__})
#define threadgroup_barrier(...) ::emu::barrier("threadgroup_barrier", EMU_MSL_HERE)
// A simdgroup barrier is a warp collective: every lane of the simdgroup must reach it.
#define simdgroup_barrier(...) ((void)::emu::warp_shuffle(0, int(::emu::current_thread->lane), "simdgroup_barrier", EMU_MSL_HERE))

// Math: the host's accurate functions for every flavour (metal::, precise::, fast::): the
// emulator checks logic, not the GPU's rounding. Templates, so that float, half and bfloat all
// work (a half's function computed in float, rounded once to half).
#define EMU_MSL_UNARY(name, expr)                                       \
    template <class T, class = std::enable_if_t<::emu_msl::is_msl_float<T>>> \
    inline T name(T x) {                                                \
        return T(expr);                                                 \
    }
#define EMU_MSL_MATH(NS_OPEN, NS_CLOSE)                         \
    NS_OPEN                                                     \
    EMU_MSL_UNARY(exp, std::exp(float(x)))                      \
    EMU_MSL_UNARY(exp2, std::exp2(float(x)))                    \
    EMU_MSL_UNARY(log, std::log(float(x)))                      \
    EMU_MSL_UNARY(log2, std::log2(float(x)))                    \
    EMU_MSL_UNARY(sqrt, std::sqrt(float(x)))                    \
    EMU_MSL_UNARY(rsqrt, 1.0f / std::sqrt(float(x)))            \
    EMU_MSL_UNARY(tanh, std::tanh(float(x)))                    \
    EMU_MSL_UNARY(sin, std::sin(float(x)))                      \
    EMU_MSL_UNARY(cos, std::cos(float(x)))                      \
    EMU_MSL_UNARY(fabs, std::fabs(float(x)))                    \
    EMU_MSL_UNARY(abs, std::fabs(float(x)))                     \
    EMU_MSL_UNARY(floor, std::floor(float(x)))                  \
    EMU_MSL_UNARY(ceil, std::ceil(float(x)))                    \
    template <class T>                                          \
    inline T pow(T x, T y) {                                    \
        return T(std::pow(float(x), float(y)));                 \
    }                                                           \
    template <class T>                                          \
    inline T divide(T x, T y) {                                 \
        return x / y;                                           \
    }                                                           \
    NS_CLOSE
EMU_MSL_MATH(, )
EMU_MSL_MATH(namespace precise {, })
EMU_MSL_MATH(namespace fast {, })
#undef EMU_MSL_MATH
#undef EMU_MSL_UNARY

template <class T>
inline T fma(T a, T b, T c) {
    return T(std::fma(float(a), float(b), float(c)));
}
// min/max take one type, as in MSL (int with uint is an error there too).
template <class T>
inline T max(T a, T b) {
    return a < b ? b : a;
}
template <class T>
inline T min(T a, T b) {
    return b < a ? b : a;
}
template <class T>
inline T fmax(T a, T b) {
    return T(std::fmax(float(a), float(b)));
}
template <class T>
inline T fmin(T a, T b) {
    return T(std::fmin(float(a), float(b)));
}
template <class T>
inline T clamp(T x, T lo, T hi) {
    return min(max(x, lo), hi);
}
template <class T>
inline T select(T a, T b, bool c) {
    return c ? b : a;
}
template <class T>
inline bool isnan(T x) {
    return std::isnan(float(x));
}
template <class T>
inline bool isinf(T x) {
    return std::isinf(float(x));
}
template <class T, int N>
inline T dot(const emu_msl::vec<T, N>& a, const emu_msl::vec<T, N>& b) {
    T s = 0;
    for (int i = 0; i < N; ++i) s += a[i] * b[i];
    return s;
}
template <class To, class From>
inline To as_type(From x) {
    static_assert(sizeof(To) == sizeof(From), "as_type between types of one size");
    To r;
    std::memcpy(&r, &x, sizeof r);
    return r;
}

// ---- simdgroup functions --------------------------------------------------------------------
// Each is a warp collective: every lane of the simdgroup that exists must reach it at the same
// source line (the core reports a lane that left or waits elsewhere).

namespace detail {
template <class T>
T shuffle(T value, int source_lane, const char* name, emu::SourceLocation where) {
    return emu::from_bits<T>(emu::warp_shuffle(emu::to_bits(value), source_lane, name, where));
}
inline int lanes() { return __builtin_popcountll(emu::warp_lanes_mask()); }
inline int lane() { return emu::current_thread->lane; }

template <class T, class Op>
T reduce(T value, Op op, const char* name, emu::SourceLocation where) {
    // Down a tree to lane 0 (lanes past the last one that exists read themselves and are not
    // combined), then lane 0's result to every lane.
    const int n = lanes(), self = lane();
    for (int offset = 1; offset < n; offset *= 2) {
        const bool has_partner = (self % (2 * offset)) == 0 && self + offset < n;
        const T other = shuffle(value, has_partner ? self + offset : self, name, where);
        if (has_partner) value = op(value, other);
    }
    return shuffle(value, 0, name, where);
}
}  // namespace detail

#define simd_sum(x) ::metal::detail::reduce((x), [](auto a, auto b) { return a + b; }, "simd_sum", EMU_MSL_HERE)
#define simd_max(x) ::metal::detail::reduce((x), [](auto a, auto b) { return a < b ? b : a; }, "simd_max", EMU_MSL_HERE)
#define simd_min(x) ::metal::detail::reduce((x), [](auto a, auto b) { return b < a ? b : a; }, "simd_min", EMU_MSL_HERE)
#define simd_broadcast(x, lane) ::metal::detail::checked_shuffle((x), int(lane), "simd_broadcast", EMU_MSL_HERE)
#define simd_shuffle(x, lane) ::metal::detail::checked_shuffle((x), int(lane), "simd_shuffle", EMU_MSL_HERE)
#define simd_shuffle_xor(x, mask) ::metal::detail::shuffle_xor((x), int(mask), EMU_MSL_HERE)
#define simd_shuffle_down(x, delta) ::metal::detail::shuffle_down((x), int(delta), EMU_MSL_HERE)
#define simd_shuffle_up(x, delta) ::metal::detail::shuffle_up((x), int(delta), EMU_MSL_HERE)

namespace detail {
template <class T>
T checked_shuffle(T value, int source_lane, const char* name, emu::SourceLocation where) {
    return shuffle(value, source_lane, name, where);  // the core reports a lane that does not exist
}
// Lanes whose source lies outside the simdgroup keep their own value, as MSL specifies.
template <class T>
T shuffle_xor(T value, int mask, emu::SourceLocation where) {
    const int source = lane() ^ mask;
    return shuffle(value, source < lanes() ? source : lane(), "simd_shuffle_xor", where);
}
template <class T>
T shuffle_down(T value, int delta, emu::SourceLocation where) {
    const int source = lane() + delta;
    return shuffle(value, source < lanes() ? source : lane(), "simd_shuffle_down", where);
}
template <class T>
T shuffle_up(T value, int delta, emu::SourceLocation where) {
    const int source = lane() - delta;
    return shuffle(value, source >= 0 ? source : lane(), "simd_shuffle_up", where);
}
}  // namespace detail

// ---- simdgroup matrices (<metal_simdgroup_matrix>) --------------------------------------------
// simdgroup_matrix<T, Cols, Rows> (simdgroup_float8x8, simdgroup_half8x8) is one matrix spread
// over the lanes of a simdgroup, as on a GPU: here lane l holds the elements e (row-major index)
// with e % lanes == l, its fragment. Every function on a matrix is a simdgroup collective: each
// lane of a full simdgroup must take part in it. A multiply-accumulate and a store are collectives
// of the core (every lane there, at one source line, or a report naming the line); a load moves
// no data between lanes, so it waits for no one: each lane logs its loads, and the next
// multiply-accumulate or store checks that every lane ran the same ones (a lane that skipped one
// is reported there, with the loads' lines). A load or store moves only the lane's own fragment,
// as the lane arrives, so a lane that reads threadgroup memory before the other threads have
// staged it (a missing threadgroup_barrier) reads the poison (NaN), under every schedule,
// lockstep included. A multiply-accumulate swaps the operands' fragments through an exchange
// area and each lane computes its own fragment of the result. A matrix is NaN until loaded,
// filled or computed. (A load whose matrix is never multiplied or stored is not checked.)
//
// matrix_origin (x, y) is (column, row) of the element that becomes (0, 0), elements_per_row the
// source's row stride; transpose_matrix reads element (r, c) from (c, r). Products sum in k order
// in float (a GPU's order and rounding are its own: check:'s tolerance covers the sums).

template <class T, int Cols, int Rows>
struct simdgroup_matrix {
    static_assert(Cols == 8 && Rows == 8, "the emulator has 8x8 simdgroup matrices");
    T e[Rows * Cols];  // this lane's fragment: e[i] for i % lanes == lane (the rest unused)
    simdgroup_matrix() {
        for (T& x : e) x = T(NAN);
    }
};

template <class T, int Cols, int Rows>
simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T value) {
    simdgroup_matrix<T, Cols, Rows> m;
    for (T& x : m.e) x = value;
    return m;
}

namespace detail {
inline void require_full_simdgroup(const char* name, emu::SourceLocation where) {
    if (lanes() != emu::config().warp_size)
        emu::fail(std::string(name) + ": a simdgroup matrix needs a full simdgroup (" + std::to_string(lanes()) +
                      " of " + std::to_string(emu::config().warp_size) + " lanes here)",
                  where);
}

// Loads move no data between lanes, so they wait for no one: each lane logs its loads, and the
// next multiply-accumulate or store (a true collective: every lane there, at one line) checks
// that every lane of the simdgroup ran the same loads since the last one. The log is per thread,
// thread_local, so the core's poison at each threadgroup start sets every lane's alike (-1).
enum { LOGGED_LINES = 8 };
struct LoadLog {
    int count;        // loads since the last collective, minus one (-1: none)
    uint64_t hash;    // of their source lines, in order
    int lines[LOGGED_LINES];
    int syncs;        // collectives so far, minus one: the parity picks the exchange area
};
inline thread_local LoadLog load_log[1024];   // by index in the threadgroup

inline LoadLog& this_lanes_log() { return load_log[emu::current_thread->linear_index]; }

inline void log_load(emu::SourceLocation where) {
    LoadLog& log = this_lanes_log();
    ++log.count;
    log.hash = log.hash * 1000003u ^ uint64_t(where.line);
    if (log.count < LOGGED_LINES) log.lines[log.count] = where.line;
}

// The exchange area of a simdgroup, for up to 1024 simdgroups (a threadgroup of 1024 threads in
// simdgroups of 1), two sets by the parity of the collective's count (a lane can run one
// collective ahead of the slowest, never two): the operands a, b, c of a multiply-accumulate,
// and each lane's load log.
struct Exchange {
    float operands[3][64];
    LoadLog logs[64];
};
inline Exchange& exchange_of_this_simdgroup(int parity) {
    static Exchange area[1024][2];
    return area[emu::current_thread->warp][parity];
}

inline std::string lines_of(const LoadLog& log) {
    std::string s;
    for (int i = 0; i <= log.count && i < LOGGED_LINES; ++i) s += (i ? ", " : "") + std::to_string(log.lines[i]);
    return s + (log.count >= LOGGED_LINES ? ", ..." : "");
}

// A collective of every lane of a full simdgroup at this line (the core checks that), which
// also checks the lanes' loads since the last one; returns this collective's exchange area,
// filled by every lane before `fill_in` returned.
template <class Fill>
Exchange& simdgroup_collective(const char* name, emu::SourceLocation where, Fill fill_in) {
    require_full_simdgroup(name, where);
    LoadLog& log = this_lanes_log();
    Exchange& exchange = exchange_of_this_simdgroup(++log.syncs & 1);
    exchange.logs[lane()] = log;
    fill_in(exchange);
    emu::warp_shuffle(0, lane(), name, where);
    const LoadLog& first = exchange.logs[0];
    if (log.count != first.count || log.hash != first.hash)
        emu::fail(std::string(name) + ": the lanes of a simdgroup ran different simdgroup_loads before it (lane 0: " +
                      std::to_string(first.count + 1) + " at lines " + lines_of(first) + "; lane " +
                      std::to_string(lane()) + ": " + std::to_string(log.count + 1) + " at lines " + lines_of(log) +
                      "): every lane must take part in each",
                  where);
    log.count = -1;
    log.hash = ~uint64_t(0);
    return exchange;
}

template <class T, int C, int R, class P>
void simdgroup_load(emu::SourceLocation where, simdgroup_matrix<T, C, R>& d, P* src, ulong elements_per_row = C,
                    ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false) {
    require_full_simdgroup("simdgroup_load", where);
    for (int i = lane(); i < R * C; i += lanes()) {   // this lane's fragment, as it arrives
        const ulong r = ulong(i / C), c = ulong(i % C);
        const ulong row = transpose_matrix ? c : r, col = transpose_matrix ? r : c;
        d.e[i] = T(src[(matrix_origin.y + row) * elements_per_row + matrix_origin.x + col]);
    }
    log_load(where);
}

template <class T, int C, int R, class P>
void simdgroup_store(emu::SourceLocation where, const simdgroup_matrix<T, C, R>& a, P* dst,
                     ulong elements_per_row = C, ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false) {
    for (int i = lane(); i < R * C; i += lanes()) {   // this lane's fragment, as it arrives
        const ulong r = ulong(i / C), c = ulong(i % C);
        const ulong row = transpose_matrix ? c : r, col = transpose_matrix ? r : c;
        dst[(matrix_origin.y + row) * elements_per_row + matrix_origin.x + col] = a.e[i];
    }
    simdgroup_collective("simdgroup_store", where, [](Exchange&) {});
}

// d = a b + c (c may be d, a or b).
template <class T, int C, int R>
void simdgroup_multiply_accumulate(emu::SourceLocation where, simdgroup_matrix<T, C, R>& d,
                                   const simdgroup_matrix<T, C, R>& a, const simdgroup_matrix<T, C, R>& b,
                                   const simdgroup_matrix<T, C, R>& c) {
    Exchange& exchange =
        simdgroup_collective("simdgroup_multiply_accumulate", where, [&](Exchange& x) {
            for (int i = lane(); i < R * C; i += lanes()) {   // this lane's fragments of a, b, c
                x.operands[0][i] = float(a.e[i]);
                x.operands[1][i] = float(b.e[i]);
                x.operands[2][i] = float(c.e[i]);
            }
        });
    for (int i = lane(); i < R * C; i += lanes()) {   // this lane's fragment of d
        const int r = i / C, col = i % C;
        float sum = exchange.operands[2][i];
        for (int k = 0; k < C; ++k) sum += exchange.operands[0][r * C + k] * exchange.operands[1][k * C + col];
        d.e[i] = T(sum);
    }
}

template <class T, int C, int R>
void simdgroup_multiply(emu::SourceLocation where, simdgroup_matrix<T, C, R>& d, const simdgroup_matrix<T, C, R>& a,
                        const simdgroup_matrix<T, C, R>& b) {
    simdgroup_multiply_accumulate(where, d, a, b, make_filled_simdgroup_matrix<T, C, R>(T(0)));
}
}  // namespace detail

#define simdgroup_load(...) ::metal::detail::simdgroup_load(EMU_MSL_HERE, __VA_ARGS__)
#define simdgroup_store(...) ::metal::detail::simdgroup_store(EMU_MSL_HERE, __VA_ARGS__)
#define simdgroup_multiply_accumulate(...) ::metal::detail::simdgroup_multiply_accumulate(EMU_MSL_HERE, __VA_ARGS__)
#define simdgroup_multiply(...) ::metal::detail::simdgroup_multiply(EMU_MSL_HERE, __VA_ARGS__)

// ---- atomics --------------------------------------------------------------------------------
// Plain read-modify-writes: all GPU threads run on one OS thread and switch only at barriers
// and collectives, so nothing comes between the read and the write.

enum memory_order { memory_order_relaxed };

template <class T>
struct atomic {
    T value;
};

template <class T>
T atomic_load_explicit(const volatile atomic<T>* a, memory_order) {
    return a->value;
}
template <class T, class U>
void atomic_store_explicit(volatile atomic<T>* a, U v, memory_order) {
    a->value = T(v);
}
#define EMU_MSL_ATOMIC(name, update)                                          \
    template <class T, class U>                                               \
    T name(volatile atomic<T>* a, U operand, memory_order) {                  \
        const T old = a->value;                                               \
        const T v = T(operand);                                               \
        a->value = (update);                                                  \
        return old;                                                           \
    }
EMU_MSL_ATOMIC(atomic_fetch_add_explicit, old + v)
EMU_MSL_ATOMIC(atomic_fetch_sub_explicit, old - v)
EMU_MSL_ATOMIC(atomic_fetch_max_explicit, old < v ? v : old)
EMU_MSL_ATOMIC(atomic_fetch_min_explicit, v < old ? v : old)
EMU_MSL_ATOMIC(atomic_exchange_explicit, v)
#undef EMU_MSL_ATOMIC
template <class T, class U>
bool atomic_compare_exchange_weak_explicit(volatile atomic<T>* a, T* expected, U desired, memory_order,
                                           memory_order) {
    if (a->value == *expected) {
        a->value = T(desired);
        return true;
    }
    *expected = a->value;
    return false;
}

}  // namespace metal

using atomic_int = metal::atomic<int>;
using atomic_uint = metal::atomic<uint>;
using atomic_float = metal::atomic<float>;
using simdgroup_float8x8 = metal::simdgroup_matrix<float, 8, 8>;
using simdgroup_half8x8 = metal::simdgroup_matrix<half, 8, 8>;
