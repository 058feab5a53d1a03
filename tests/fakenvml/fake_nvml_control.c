/*
 * fake_nvml_control.c - the fake libnvidia-ml.so.1's control API (fakenvml_*), called by
 * tests through ctypes on the library pynvml loaded (tests/fakenvml/control.py).
 */

#include "fake_nvml.h"

int fakenvml_api_version(void)
{
    return FAKE_API_VERSION;
}

const char *fakenvml_build_id(void)
{
    return FAKENVML_BUILD_ID;
}

void fakenvml_reset(void)
{
    lock();
    reset_locked();
    unlock();
}

int fakenvml_set_device_count(unsigned int n)
{
    int rc;
    lock();
    rc = set_count_locked(n);
    unlock();
    return rc;
}

int fakenvml_configure_device(unsigned int index, const char *uuid, unsigned int min_mw,
                              unsigned int max_mw, unsigned int default_mw,
                              unsigned int current_mw)
{
    struct nvmlDevice_st d;
    if (index >= MAX_DEVICES)
        return -1;
    lock();
    if (index >= g_count)
        set_count_locked(index + 1);
    d = g_devs[index];
    if (uuid != NULL && copy_uuid(d.uuid, uuid) != 0) {
        unlock();
        return -1;
    }
    d.min_mw = min_mw;
    d.max_mw = max_mw;
    d.default_mw = default_mw;
    d.current_mw = current_mw;
    g_devs[index] = d;
    unlock();
    return 0;
}

int fakenvml_set_processes(unsigned int index, const unsigned int *pids, unsigned int n)
{
    if (index >= MAX_DEVICES || n > MAX_PIDS || (n > 0 && pids == NULL))
        return -1;
    lock();
    if (n > 0)
        memcpy(g_devs[index].pids, pids, n * sizeof pids[0]);
    g_devs[index].npids = n;
    unlock();
    return 0;
}

int fakenvml_inject(const char *function, int device, int rc, long times, long after,
                    double hang_seconds)
{
    int result;
    lock();
    result = add_fault(fn_lookup(function), device, rc, times, after, hang_seconds);
    unlock();
    return result;
}

void fakenvml_clear_faults(void)
{
    unsigned int i;
    lock();
    memset(g_faults, 0, sizeof g_faults);
    for (i = 0; i < MAX_DEVICES; i++)
        g_devs[i].uuid_change_pending = 0;
    unlock();
}

int fakenvml_change_uuid(unsigned int index, unsigned int after_calls, const char *new_uuid)
{
    int rc = -1;
    if (index >= MAX_DEVICES)
        return -1;
    lock();
    if (copy_uuid(g_devs[index].next_uuid, new_uuid) == 0) {
        g_devs[index].uuid_change_pending = 1;
        g_devs[index].uuid_change_after = after_calls;
        rc = 0;
    }
    unlock();
    return rc;
}


unsigned int fakenvml_write_log_count(void)
{
    unsigned int n;
    lock();
    n = g_log_len;
    unlock();
    return n;
}

int fakenvml_write_log_entry(unsigned int i, int *device, unsigned int *milliwatts, int *rc,
                             char *uuid, unsigned int uuid_len)
{
    int result = -1;
    lock();
    if (i < g_log_len && device != NULL && milliwatts != NULL && rc != NULL && uuid != NULL &&
        uuid_len > 0) {
        *device = g_log[i].device;
        *milliwatts = g_log[i].milliwatts;
        *rc = g_log[i].rc;
        snprintf(uuid, uuid_len, "%s", g_log[i].uuid);
        result = 0;
    }
    unlock();
    return result;
}

long fakenvml_limit(unsigned int index)
{
    long mw = -1;
    lock();
    if (index < g_count)
        mw = (long)g_devs[index].current_mw;
    unlock();
    return mw;
}

int fakenvml_device_uuid(unsigned int index, char *uuid, unsigned int uuid_len)
{
    int rc = -1;
    lock();
    if (index < g_count && uuid != NULL && uuid_len > strlen(g_devs[index].uuid)) {
        snprintf(uuid, uuid_len, "%s", g_devs[index].uuid);
        rc = 0;
    }
    unlock();
    return rc;
}

/* Calls of a function (any name form) on a device, or on all devices if device < 0. */
long fakenvml_call_count(const char *function, int device)
{
    int fn = fn_lookup(function);
    long total = 0;
    int i;
    if (fn < 0 || device >= MAX_DEVICES)
        return -1;
    lock();
    if (device >= 0) {
        total = (long)g_calls[fn][device];
    } else {
        for (i = 0; i <= MAX_DEVICES; i++)
            total += (long)g_calls[fn][i];
    }
    unlock();
    return total;
}

int fakenvml_init_count(void)
{
    int n;
    lock();
    n = g_refcount;
    unlock();
    return n;
}


/* -- health ------------------------------------------------------------- */

/* Device `index` with the lock taken, or NULL (lock not taken) past MAX_DEVICES. */
static struct nvmlDevice_st *lock_device(unsigned int index)
{
    if (index >= MAX_DEVICES)
        return NULL;
    lock();
    return &g_devs[index];
}

int fakenvml_set_power_draw(unsigned int index, unsigned int milliwatts)
{
    struct nvmlDevice_st *d = lock_device(index);
    if (d == NULL)
        return -1;
    d->draw_mw = milliwatts;
    unlock();
    return 0;
}

int fakenvml_set_enforced_limit(unsigned int index, long milliwatts)
{
    struct nvmlDevice_st *d;
    if (milliwatts > (long)UINT32_MAX || (d = lock_device(index)) == NULL)
        return -1;
    d->enforced_follows = milliwatts < 0;
    d->enforced_mw = milliwatts < 0 ? 0 : (unsigned int)milliwatts;
    unlock();
    return 0;
}

int fakenvml_set_clocks_event_reasons(unsigned int index, unsigned long long mask)
{
    struct nvmlDevice_st *d = lock_device(index);
    if (d == NULL)
        return -1;
    d->clocks_mask = mask;
    unlock();
    return 0;
}

int fakenvml_set_ecc_errors(unsigned int index, unsigned long long count)
{
    struct nvmlDevice_st *d = lock_device(index);
    if (d == NULL)
        return -1;
    d->ecc_volatile = count;
    unlock();
    return 0;
}

int fakenvml_add_ecc_errors(unsigned int index, unsigned long long count, int with_event)
{
    struct nvmlDevice_st *d = lock_device(index);
    if (d == NULL)
        return -1;
    d->ecc_volatile += count;
    if (with_event)
        queue_event_locked((int)index, nvmlEventTypeDoubleBitEccError, 0, 1);
    unlock();
    return 0;
}

int fakenvml_set_row_remap(unsigned int index, int pending, int failure)
{
    struct nvmlDevice_st *d = lock_device(index);
    if (d == NULL)
        return -1;
    d->remap_pending = pending != 0;
    d->remap_failure = failure != 0;
    unlock();
    return 0;
}

int fakenvml_set_older_part(unsigned int index, int older_part, int retired_pending)
{
    struct nvmlDevice_st *d = lock_device(index);
    if (d == NULL)
        return -1;
    d->older_part = older_part != 0;
    d->retired_pending = retired_pending != 0;
    unlock();
    return 0;
}

int fakenvml_set_lost(unsigned int index, int lost)
{
    struct nvmlDevice_st *d = lock_device(index);
    if (d == NULL)
        return -1;
    d->lost = lost != 0;
    unlock();
    return 0;
}

int fakenvml_set_supported_events(unsigned int index, unsigned long long mask)
{
    struct nvmlDevice_st *d = lock_device(index);
    if (d == NULL)
        return -1;
    d->supported_events = mask;
    unlock();
    return 0;
}
