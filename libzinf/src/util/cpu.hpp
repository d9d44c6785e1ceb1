// Private to libzinf: hot loops built once per instruction-set level and
// called through a function pointer picked at their first call.
//
//   ZINF_TARGET_V4 void sum_v4(...) { sum_in(...); }      // sum_in: always_inline
//   ZINF_TARGET_AVX2 void sum_avx2(...) { sum_in(...); }
//   void sum_base(...) { sum_in(...); }
//   void sum(...) { static const auto run = for_cpu(sum_v4, sum_avx2, sum_base); run(...); }
//
// Not GCC's target_clones, which picks through an ifunc resolver: the dynamic
// loader runs resolvers while it relocates the program, before a sanitizer's
// runtime has started, and ThreadSanitizer's instrumentation of the resolver
// (__tsan_func_entry) crashes there, before main.
#pragma once

#define ZINF_TARGET_V4 [[gnu::target("arch=x86-64-v4")]]
#define ZINF_TARGET_AVX2 [[gnu::target("avx2")]]

namespace zinf {

enum class CpuLevel { base, avx2, v4 };

// This CPU's level, as target_clones("arch=x86-64-v4", "avx2", "default") picks.
inline CpuLevel cpu_level() {
    static const CpuLevel level = [] {
        __builtin_cpu_init();
        // x86-64-v4 feature by feature: clang before 16 knows no level names
        // in __builtin_cpu_supports (and `make fuzz` builds with clang 14).
        // Every CPU with these has the rest of the level (movbe, lzcnt, ...).
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") &&
            __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vl"))
            return CpuLevel::v4;
        if (__builtin_cpu_supports("avx2")) return CpuLevel::avx2;
        return CpuLevel::base;
    }();
    return level;
}

template <class Fn>
Fn for_cpu(Fn v4, Fn avx2, Fn base) {
    switch (cpu_level()) {
    case CpuLevel::v4: return v4;
    case CpuLevel::avx2: return avx2;
    case CpuLevel::base: break;
    }
    return base;
}

}  // namespace zinf
