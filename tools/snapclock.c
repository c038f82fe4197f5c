/* snapclock: a pinned wall clock for tools/snapshot.py (LD_PRELOAD).

   Overrides time(), gettimeofday() and clock_gettime() for CLOCK_REALTIME and CLOCK_REALTIME_COARSE only:
   the wall clock reads SNAPCLOCK_EPOCH (seconds since 1970, may have a fraction) plus SNAPCLOCK_RATE times
   the real monotonic time elapsed since the process started (rate 0, the default: a frozen clock; rate 1:
   a clock that runs). Every other clock (CLOCK_MONOTONIC, CPU clocks), and so every timed wait, timeout and
   sleep, is the real one: libfaketime, which shifts those too, makes timed waits fail with EINVAL here.
   Without SNAPCLOCK_EPOCH in the environment nothing is changed.

   Built by tools/snapshot.py: gcc -shared -fPIC -O2 -o snapclock.so snapclock.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int pinned = -1;
static long double epoch, rate;
static struct timespec t0;

static int real_gettime(clockid_t clk, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, clk, ts);
}

static void init(void) {
    if (pinned >= 0)
        return;
    const char *e = getenv("SNAPCLOCK_EPOCH");
    const char *r = getenv("SNAPCLOCK_RATE");
    pinned = e != NULL && *e != '\0';
    if (pinned) {
        epoch = strtold(e, NULL);
        rate = r ? strtold(r, NULL) : 0.0L;
        real_gettime(CLOCK_MONOTONIC, &t0);
    }
}

__attribute__((constructor)) static void snapclock_init(void) { init(); }

static void pinned_now(struct timespec *ts) {
    struct timespec m;
    real_gettime(CLOCK_MONOTONIC, &m);
    long double elapsed = (long double)(m.tv_sec - t0.tv_sec) + (long double)(m.tv_nsec - t0.tv_nsec) / 1e9L;
    long double now = epoch + rate * elapsed;
    ts->tv_sec = (time_t)now;
    ts->tv_nsec = (long)((now - (long double)ts->tv_sec) * 1e9L);
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    init();
    if (pinned && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) {
        pinned_now(ts);
        return 0;
    }
    return real_gettime(clk, ts);
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    init();
    struct timespec ts;
    if (pinned)
        pinned_now(&ts);
    else
        real_gettime(CLOCK_REALTIME, &ts);
    if (tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
