/*
 * fake_nvml_events.c - the fake libnvidia-ml.so.1's device events: event sets,
 * registration, and one bounded queue of pending events that waits take from.
 *
 * A test (or the config file) queues events; nvmlEventSetWait_v2 on a set
 * returns the oldest queued event whose device and type that set registered,
 * and removes it. Events nobody registered for stay queued (until reset), so
 * events queued before a backend registers still reach it. One event goes to
 * one waiter, even if several sets registered its device (real NVML would
 * deliver it to each set; capwatch uses one). The queue holds MAX_EVENTS;
 * more are dropped and counted. Waits block on a condition variable with the
 * state mutex released, and wake when an event is queued, the set is freed
 * (NVML_ERROR_INVALID_ARGUMENT), or the last nvmlShutdown runs
 * (NVML_ERROR_UNINITIALIZED).
 */

#include "fake_nvml.h"

struct queued_event {
    int device;
    int taken;
    unsigned long long type;
    unsigned long long data;
};

static struct nvmlEventSet_st g_sets[MAX_EVENT_SETS];
static struct queued_event g_queue[MAX_EVENTS]; /* ring: g_head, g_len slots (some taken) */
static unsigned int g_head;
static unsigned int g_len;
static unsigned int g_pending; /* slots not taken */
static unsigned long g_dropped;
static int g_waiters;

static const struct {
    const char *name;
    unsigned long long type;
} EVENT_NAMES[] = {
    {"xid", nvmlEventTypeXidCriticalError},
    {"dbe", nvmlEventTypeDoubleBitEccError},
    {"double_bit_ecc", nvmlEventTypeDoubleBitEccError},
    {"sbe", nvmlEventTypeSingleBitEccError},
};

/* "xid", "dbe", "sbe" or a number (one event type bit, e.g. 0x8); 0 on success. */
int event_type_parse(const char *token, unsigned long long *out)
{
    size_t i;
    char *end;
    unsigned long long v;
    if (token == NULL || *token == '\0' || *token == '-')
        return -1;
    for (i = 0; i < sizeof EVENT_NAMES / sizeof EVENT_NAMES[0]; i++) {
        if (strcasecmp(token, EVENT_NAMES[i].name) == 0) {
            *out = EVENT_NAMES[i].type;
            return 0;
        }
    }
    errno = 0;
    v = strtoull(token, &end, 0);
    if (errno != 0 || *end != '\0' || v == 0)
        return -1;
    *out = v;
    return 0;
}

void free_all_sets_locked(void)
{
    unsigned int i;
    for (i = 0; i < MAX_EVENT_SETS; i++) {
        if (g_sets[i].used) {
            g_sets[i].used = 0;
            g_sets[i].generation++;
        }
    }
    wake_all_locked();
}

void events_reset_locked(void)
{
    free_all_sets_locked();
    memset(g_queue, 0, sizeof g_queue);
    g_head = g_len = g_pending = 0;
    g_dropped = 0;
}

/* Slot of a set handle we gave out and that is still live, or -1. */
static int set_slot(nvmlEventSet_t set)
{
    uintptr_t base = (uintptr_t)&g_sets[0];
    uintptr_t addr = (uintptr_t)set;
    if (addr < base || addr >= base + sizeof g_sets || (addr - base) % sizeof g_sets[0] != 0)
        return -1;
    return g_sets[(addr - base) / sizeof g_sets[0]].used ? (int)((addr - base) / sizeof g_sets[0])
                                                         : -1;
}

/* Drop taken slots, keeping order: only when the ring is full. */
static void compact_locked(void)
{
    unsigned int i, kept = 0;
    static struct queued_event tmp[MAX_EVENTS];
    for (i = 0; i < g_len; i++) {
        struct queued_event *e = &g_queue[(g_head + i) % MAX_EVENTS];
        if (!e->taken)
            tmp[kept++] = *e;
    }
    memcpy(g_queue, tmp, kept * sizeof tmp[0]);
    g_head = 0;
    g_len = kept;
}

int queue_event_locked(int device, unsigned long long type, unsigned long long data,
                       unsigned int count)
{
    unsigned int i, queued = 0;
    if (device < 0 || device >= MAX_DEVICES || type == 0)
        return -1;
    for (i = 0; i < count; i++) {
        struct queued_event *e;
        if (g_len == MAX_EVENTS)
            compact_locked();
        if (g_len == MAX_EVENTS) {
            g_dropped += count - i;
            break;
        }
        e = &g_queue[(g_head + g_len) % MAX_EVENTS];
        e->device = device;
        e->taken = 0;
        e->type = type;
        e->data = data;
        g_len++;
        g_pending++;
        queued++;
    }
    if (queued > 0)
        wake_all_locked();
    return (int)queued;
}

/* Take the oldest pending event the set registered for; 1 if one was taken. */
static int take_locked(const struct nvmlEventSet_st *s, nvmlEventData_t *data)
{
    unsigned int i;
    for (i = 0; i < g_len; i++) {
        struct queued_event *e = &g_queue[(g_head + i) % MAX_EVENTS];
        if (e->taken || (s->registered[e->device] & e->type) == 0)
            continue;
        memset(data, 0, sizeof *data);
        data->device = &g_devs[e->device];
        data->eventType = e->type;
        /* nvml.h: eventData is the XID for XID events, 0 for any other. */
        data->eventData = e->type == nvmlEventTypeXidCriticalError ? e->data : 0;
        data->gpuInstanceId = NO_INSTANCE;
        data->computeInstanceId = NO_INSTANCE;
        e->taken = 1;
        g_pending--;
        while (g_len > 0 && g_queue[g_head].taken) {
            g_head = (g_head + 1) % MAX_EVENTS;
            g_len--;
        }
        return 1;
    }
    return 0;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    unsigned int i;
    nvmlReturn_t rc = enter(FN_EVENT_SET_CREATE, ANY_DEVICE);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    if (g_refcount == 0) {
        rc = NVML_ERROR_UNINITIALIZED;
    } else if (set == NULL) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        rc = NVML_ERROR_MEMORY;
        for (i = 0; i < MAX_EVENT_SETS; i++) {
            if (g_sets[i].used)
                continue;
            g_sets[i].used = 1;
            memset(g_sets[i].registered, 0, sizeof g_sets[i].registered);
            *set = &g_sets[i];
            rc = NVML_SUCCESS;
            break;
        }
    }
    unlock();
    return rc;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    struct nvmlDevice_st *d = NULL;
    int idx = handle_index(device);
    nvmlReturn_t rc = enter(FN_SUPPORTED_EVENTS, idx);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    rc = device_locked(idx, &d);
    if (rc == NVML_SUCCESS && eventTypes == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *eventTypes = d->supported_events;
    unlock();
    return rc;
}

/* Like NVML: asking for a type the device does not support is NOT_SUPPORTED. */
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set)
{
    struct nvmlDevice_st *d = NULL;
    int idx = handle_index(device);
    int slot;
    nvmlReturn_t rc = enter(FN_REGISTER_EVENTS, idx);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    rc = device_locked(idx, &d);
    slot = set_slot(set);
    if (rc == NVML_SUCCESS && slot < 0)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && (eventTypes & ~d->supported_events) != 0)
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc == NVML_SUCCESS)
        g_sets[slot].registered[idx] |= eventTypes;
    unlock();
    return rc;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    struct timespec deadline;
    unsigned long generation;
    int slot;
    nvmlReturn_t rc = enter(FN_EVENT_WAIT, ANY_DEVICE);
    if (rc != NVML_SUCCESS)
        return rc;
    monotonic_deadline(timeoutms, &deadline);
    lock();
    slot = set_slot(set);
    if (g_refcount == 0) {
        unlock();
        return NVML_ERROR_UNINITIALIZED;
    }
    if (slot < 0 || data == NULL) {
        unlock();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    generation = g_sets[slot].generation;
    g_waiters++;
    for (;;) {
        if (take_locked(&g_sets[slot], data)) {
            rc = NVML_SUCCESS;
            break;
        }
        if (g_refcount == 0) {
            rc = NVML_ERROR_UNINITIALIZED;
            break;
        }
        if (!g_sets[slot].used || g_sets[slot].generation != generation) {
            rc = NVML_ERROR_INVALID_ARGUMENT; /* freed while we waited */
            break;
        }
        if (wait_until_locked(&deadline) == ETIMEDOUT) {
            rc = take_locked(&g_sets[slot], data) ? NVML_SUCCESS : NVML_ERROR_TIMEOUT;
            break;
        }
    }
    g_waiters--;
    unlock();
    return rc;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    int slot;
    nvmlReturn_t rc = enter(FN_EVENT_SET_FREE, ANY_DEVICE);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    slot = set_slot(set);
    if (g_refcount == 0) {
        rc = NVML_ERROR_UNINITIALIZED;
    } else if (slot < 0) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        g_sets[slot].used = 0;
        g_sets[slot].generation++;
        wake_all_locked(); /* a waiter on it returns INVALID_ARGUMENT */
    }
    unlock();
    return rc;
}

/* -- control API -------------------------------------------------------- */

int fakenvml_queue_event(unsigned int index, unsigned long long type, unsigned long long data,
                         unsigned int count)
{
    int rc;
    if (index >= MAX_DEVICES)
        return -1;
    lock();
    rc = queue_event_locked((int)index, type, data, count);
    unlock();
    return rc;
}

unsigned int fakenvml_pending_events(void)
{
    unsigned int n;
    lock();
    n = g_pending;
    unlock();
    return n;
}

unsigned long fakenvml_dropped_events(void)
{
    unsigned long n;
    lock();
    n = g_dropped;
    unlock();
    return n;
}

unsigned long long fakenvml_registered_events(unsigned int index)
{
    unsigned long long mask = 0;
    unsigned int i;
    if (index >= MAX_DEVICES)
        return 0;
    lock();
    for (i = 0; i < MAX_EVENT_SETS; i++)
        if (g_sets[i].used)
            mask |= g_sets[i].registered[index];
    unlock();
    return mask;
}

int fakenvml_event_sets(void)
{
    int n = 0;
    unsigned int i;
    lock();
    for (i = 0; i < MAX_EVENT_SETS; i++)
        n += g_sets[i].used;
    unlock();
    return n;
}

int fakenvml_event_waiters(void)
{
    int n;
    lock();
    n = g_waiters;
    unlock();
    return n;
}
