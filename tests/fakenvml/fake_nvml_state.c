/*
 * fake_nvml_state.c - the fake libnvidia-ml.so.1's state: devices, faults, logs, call
 * counts, behind one mutex; and the entry check every NVML function runs.
 */

#include "fake_nvml.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond; /* event waits; CLOCK_MONOTONIC, set up once */
static pthread_once_t g_cond_once = PTHREAD_ONCE_INIT;
struct nvmlDevice_st g_devs[MAX_DEVICES];
unsigned int g_count;
int g_refcount;
int g_config_loaded; /* FAKE_NVML_CONFIG considered since the last reset */
int g_config_broken;
static int g_state_ready; /* defaults filled in (lazily, on first use) */
struct fault g_faults[MAX_FAULTS];
struct log_entry g_log[MAX_LOG];
unsigned int g_log_len;
unsigned long g_calls[FN__COUNT][MAX_DEVICES + 1]; /* last slot: no device */
FILE *g_log_file;
char g_limits_path[4096];

static void device_defaults(unsigned int i)
{
    struct nvmlDevice_st *d = &g_devs[i];
    memset(d, 0, sizeof *d);
    snprintf(d->uuid, sizeof d->uuid, "GPU-fa4e0000-0000-4000-8000-%012x", i);
    d->min_mw = DEFAULT_MIN_MW;
    d->max_mw = DEFAULT_MAX_MW;
    d->default_mw = DEFAULT_LIMIT_MW;
    d->current_mw = DEFAULT_LIMIT_MW;
    d->draw_mw = DEFAULT_DRAW_MW;
    d->enforced_follows = 1;
    d->supported_events = DEFAULT_EVENT_TYPES;
}

void reset_locked(void)
{
    unsigned int i;
    for (i = 0; i < MAX_DEVICES; i++)
        device_defaults(i);
    g_count = DEFAULT_DEVICE_COUNT;
    g_refcount = 0;
    g_config_loaded = 0;
    g_config_broken = 0;
    memset(g_faults, 0, sizeof g_faults);
    memset(g_log, 0, sizeof g_log);
    g_log_len = 0;
    memset(g_calls, 0, sizeof g_calls);
    if (g_log_file != NULL) {
        fclose(g_log_file);
        g_log_file = NULL;
    }
    g_limits_path[0] = '\0';
    events_reset_locked();
    g_state_ready = 1;
}

static void cond_init(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g_cond, &attr);
    pthread_condattr_destroy(&attr);
}

/* Static storage starts zeroed; the defaults are filled in on first use. */
void lock(void)
{
    pthread_once(&g_cond_once, cond_init);
    pthread_mutex_lock(&g_lock);
    if (!g_state_ready)
        reset_locked();
}

void unlock(void)
{
    pthread_mutex_unlock(&g_lock);
}

int wait_until_locked(const struct timespec *deadline)
{
    int rc = pthread_cond_timedwait(&g_cond, &g_lock, deadline);
    return rc == ETIMEDOUT ? ETIMEDOUT : 0;
}

void wake_all_locked(void)
{
    pthread_cond_broadcast(&g_cond);
}

void monotonic_deadline(unsigned int ms, struct timespec *out)
{
    clock_gettime(CLOCK_MONOTONIC, out);
    out->tv_sec += (time_t)(ms / 1000U);
    out->tv_nsec += (long)(ms % 1000U) * 1000000L;
    if (out->tv_nsec >= 1000000000L) {
        out->tv_sec++;
        out->tv_nsec -= 1000000000L;
    }
}

static void sleep_seconds(double seconds)
{
    struct timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Index of the device a handle points at, or -1 for a handle we never gave out. */
int handle_index(nvmlDevice_t device)
{
    uintptr_t base = (uintptr_t)&g_devs[0];
    uintptr_t addr = (uintptr_t)device;
    if (addr < base || addr >= base + sizeof g_devs)
        return -1;
    if ((addr - base) % sizeof g_devs[0] != 0)
        return -1;
    return (int)((addr - base) / sizeof g_devs[0]);
}

/*
 * Entry of every NVML function: count the call, pick the first fault that
 * applies and consume it. A hang sleeps here with the mutex released.
 * Returns NVML_SUCCESS when the call should proceed normally.
 */
nvmlReturn_t enter(enum fn_id fn, int device)
{
    int rc = NVML_SUCCESS;
    double hang_s = 0.0;
    int i;
    int slot = (device >= 0 && device < MAX_DEVICES) ? device : MAX_DEVICES;

    lock();
    g_calls[fn][slot]++;
    for (i = 0; i < MAX_FAULTS; i++) {
        struct fault *f = &g_faults[i];
        if (!f->used || (f->fn != FN_ANY && f->fn != (int)fn))
            continue;
        if (f->device != ANY_DEVICE && f->device != device)
            continue;
        if (f->skip > 0) {
            f->skip--;
            continue;
        }
        rc = f->rc;
        hang_s = f->hang_s;
        if (f->remaining > 0 && --f->remaining == 0)
            f->used = 0;
        break;
    }
    unlock();
    if (hang_s > 0.0)
        sleep_seconds(hang_s);
    return (nvmlReturn_t)rc;
}

/* Resolve a handle to a live device, under the lock; a lost one answers GPU_IS_LOST. */
nvmlReturn_t device_locked(int index, struct nvmlDevice_st **out)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (index < 0 || (unsigned int)index >= g_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g_devs[index].lost)
        return NVML_ERROR_GPU_IS_LOST;
    *out = &g_devs[index];
    return NVML_SUCCESS;
}

int add_fault(int fn, int device, int rc, long times, long after, double hang_s)
{
    int i;
    if (fn == FN_UNKNOWN || device < ANY_DEVICE || device >= MAX_DEVICES || rc < 0 ||
        times == 0 || times < -1 || after < 0 || hang_s < 0.0)
        return -1;
    for (i = 0; i < MAX_FAULTS; i++) {
        struct fault *f = &g_faults[i];
        if (f->used)
            continue;
        f->used = 1;
        f->fn = fn;
        f->device = device;
        f->rc = rc;
        f->remaining = times;
        f->skip = after;
        f->hang_s = hang_s;
        return 0;
    }
    return -1;
}

int set_count_locked(unsigned int n)
{
    unsigned int i;
    if (n > MAX_DEVICES)
        return -1;
    for (i = g_count; i < n; i++)
        device_defaults(i);
    g_count = n;
    return 0;
}

int copy_uuid(char *dst, const char *src)
{
    if (src == NULL || *src == '\0' || strlen(src) >= UUID_LEN)
        return -1;
    snprintf(dst, UUID_LEN, "%s", src);
    return 0;
}

/* Write every device's current limit to the limits file (a temporary file renamed
 * over it: a reader never sees half of it), as "UUID MILLIWATTS" lines. */
void save_limits_locked(void)
{
    char tmp[sizeof g_limits_path + 8];
    unsigned int i;
    FILE *fp;
    if (g_limits_path[0] == '\0')
        return;
    snprintf(tmp, sizeof tmp, "%s.tmp", g_limits_path);
    fp = fopen(tmp, "w");
    if (fp == NULL)
        return;
    for (i = 0; i < g_count && i < MAX_DEVICES; i++)
        fprintf(fp, "%s %u\n", g_devs[i].uuid, g_devs[i].current_mw);
    if (fclose(fp) == 0)
        rename(tmp, g_limits_path);
}
