// Where a multi-threaded step's time goes when the machine is too loaded for
// its wall clock to mean anything: an LD_PRELOAD wrapper of libgomp's
// GOMP_parallel that times each thread's share of every OpenMP region in the
// thread's own CPU time (which other jobs move far less than the wall clock), and
// keeps, per region function, the count, the sum of the slowest thread's time
// (the region's critical path: what the step waits for) and the sum of all
// threads' time; and the CPU time each thread spends between its regions (work
// on one thread only). Critical path plus that serial time is what the step
// would take on an otherwise idle machine, barriers aside. Built and run by
// scripts/omp-regions.sh; the table goes to $OMP_REGIONS_OUT at exit.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*region_fn)(void*);

static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { kMaxThreads = 256, kSlots = 4096 };

struct call {
    region_fn fn;
    void* data;
    double busy[kMaxThreads];  // -1: the thread was not in the team
};

static void timed(void* p) {
    struct call* c = p;
    const double t0 = thread_cpu();
    c->fn(c->data);
    const int i = omp_get_thread_num();
    if (i < kMaxThreads) c->busy[i] = thread_cpu() - t0;
}

static struct {
    region_fn fn;
    long count;
    int team;
    double critical, busy;
} table[kSlots];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static double serial;
static long regions;
static __thread double last_end = -1;

void GOMP_parallel(region_fn fn, void* data, unsigned num_threads, unsigned flags) {
    static void (*real)(region_fn, void*, unsigned, unsigned);
    if (!real) *(void**)&real = dlsym(RTLD_NEXT, "GOMP_parallel");
    const double start = thread_cpu();
    static struct call zero;
    struct call c = zero;
    c.fn = fn;
    c.data = data;
    for (int i = 0; i < kMaxThreads; ++i) c.busy[i] = -1;
    real(timed, &c, num_threads, flags);
    double longest = 0, all = 0;
    int team = 0;
    for (int i = 0; i < kMaxThreads; ++i)
        if (c.busy[i] >= 0) {
            ++team;
            all += c.busy[i];
            if (c.busy[i] > longest) longest = c.busy[i];
        }
    pthread_mutex_lock(&mu);
    if (last_end >= 0) serial += start - last_end;
    unsigned h = (unsigned)(((unsigned long)fn >> 4) % kSlots);
    while (table[h].fn && table[h].fn != fn) h = (h + 1) % kSlots;
    table[h].fn = fn;
    table[h].count++;
    table[h].critical += longest;
    table[h].busy += all;
    if (team > table[h].team) table[h].team = team;
    regions++;
    pthread_mutex_unlock(&mu);
    last_end = thread_cpu();
}

// One line per region function: its offset in its object (for nm), count,
// largest team, critical-path and all threads' CPU seconds, the object; then
// the count of regions and the CPU seconds between them.
__attribute__((destructor)) static void report(void) {
    const char* path = getenv("OMP_REGIONS_OUT");
    FILE* f = path ? fopen(path, "w") : stderr;
    if (!f) return;
    for (int i = 0; i < kSlots; ++i) {
        if (!table[i].fn) continue;
        Dl_info d = {0};
        dladdr(*(void**)&table[i].fn, &d);
        const unsigned long off = (unsigned long)*(void**)&table[i].fn - (unsigned long)d.dli_fbase;
        fprintf(f, "region %lx %ld %d %.6f %.6f %s\n", off, table[i].count, table[i].team, table[i].critical,
                table[i].busy, d.dli_fname ? d.dli_fname : "?");
    }
    fprintf(f, "serial %ld %.6f\n", regions, serial);
    if (path) fclose(f);
}
