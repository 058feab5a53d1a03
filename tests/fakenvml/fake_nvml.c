/*
 * fake_nvml.c - a fake libnvidia-ml.so.1 for capwatch's tests.
 *
 * Compiled against the official nvml.h (PyPI nvidia-nvml-dev), so every NVML
 * entry point defined here has exactly the prototype the real library has, and
 * loaded by the real `pynvml` module through LD_LIBRARY_PATH. It implements the
 * subset of NVML that capwatch's NVML backend uses, plus fault injection, and
 * a control API (functions prefixed `fakenvml_`) that tests call through
 * ctypes on the same loaded library.
 *
 * Default state (no configuration): 2 devices, UUIDs
 * GPU-fa4e0000-0000-4000-8000-00000000000<i>, power limit range
 * 100000..400000 mW, default and current limit 300000 mW, no processes.
 *
 * All functions are thread-safe: one mutex guards all state.
 *
 * Files (all compiled into the one library by build.py):
 *   fake_nvml.c          the NVML entry points pynvml calls (init, limits, processes)
 *   fake_nvml_health.c   health reads: power draw, enforced limit, clocks, ECC, remapping
 *   fake_nvml_events.c   event sets, registration, the event queue and waits
 *   fake_nvml_state.c    devices, faults, logs and the per-call fault check
 *   fake_nvml_names.c    function and return-code names, nvmlErrorString
 *   fake_nvml_config.c   the FAKE_NVML_CONFIG file format (documented there)
 *   fake_nvml_control.c  the fakenvml_* control API used through ctypes
 *   fake_nvml.h          what they share (internal, hidden visibility)
 */

#include "fake_nvml.h"

static nvmlReturn_t init_common(void)
{
    nvmlReturn_t rc;
    lock();
    load_env_config_locked(); /* before the fault check, so init_error applies */
    unlock();
    rc = enter(FN_INIT, ANY_DEVICE);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    if (g_config_broken) {
        unlock();
        return NVML_ERROR_UNKNOWN;
    }
    g_refcount++;
    unlock();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void)
{
    return init_common();
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return init_common();
}

nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = enter(FN_SHUTDOWN, ANY_DEVICE);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    if (g_refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else if (--g_refcount == 0)
        free_all_sets_locked(); /* NVML releases its event sets; waiters wake */
    unlock();
    return rc;
}

static nvmlReturn_t copy_version(enum fn_id fn, const char *text, char *buf, unsigned int length)
{
    nvmlReturn_t rc = enter(fn, ANY_DEVICE);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    if (g_refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else if (buf == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (length <= strlen(text))
        rc = NVML_ERROR_INSUFFICIENT_SIZE;
    else
        snprintf(buf, length, "%s", text);
    unlock();
    return rc;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return copy_version(FN_DRIVER_VERSION, "999.99.99-fake", version, length);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return copy_version(FN_NVML_VERSION, "13.999.99-fake", version, length);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t rc = enter(FN_COUNT, ANY_DEVICE);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    if (g_refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else if (deviceCount == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else
        *deviceCount = g_count;
    unlock();
    return rc;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    struct nvmlDevice_st *d = NULL;
    int idx = index < MAX_DEVICES ? (int)index : -1;
    nvmlReturn_t rc = enter(FN_HANDLE_BY_INDEX, idx);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    rc = device_locked(idx, &d);
    if (rc == NVML_SUCCESS && device == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *device = d;
    unlock();
    return rc;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct nvmlDevice_st *d = NULL;
    int idx = handle_index(device);
    nvmlReturn_t rc = enter(FN_UUID, idx);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    rc = device_locked(idx, &d);
    if (rc == NVML_SUCCESS && uuid == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        if (d->uuid_change_pending) {
            if (d->uuid_change_after == 0) {
                memcpy(d->uuid, d->next_uuid, sizeof d->uuid);
                d->uuid_change_pending = 0;
            } else {
                d->uuid_change_after--;
            }
        }
        if (length <= strlen(d->uuid))
            rc = NVML_ERROR_INSUFFICIENT_SIZE;
        else
            snprintf(uuid, length, "%s", d->uuid);
    }
    unlock();
    return rc;
}

/* The three single-value power reads differ only in which field they return. */
enum power_field { POWER_DEFAULT, POWER_CURRENT };

static nvmlReturn_t power_read(enum fn_id fn, nvmlDevice_t device, enum power_field field,
                               unsigned int *out)
{
    struct nvmlDevice_st *d = NULL;
    int idx = handle_index(device);
    nvmlReturn_t rc = enter(fn, idx);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    rc = device_locked(idx, &d);
    if (rc == NVML_SUCCESS && out == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *out = field == POWER_DEFAULT ? d->default_mw : d->current_mw;
    unlock();
    return rc;
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    return power_read(FN_LIMIT, device, POWER_CURRENT, limit);
}

nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device,
                                                      unsigned int *defaultLimit)
{
    return power_read(FN_DEFAULT_LIMIT, device, POWER_DEFAULT, defaultLimit);
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device,
                                                          unsigned int *minLimit,
                                                          unsigned int *maxLimit)
{
    struct nvmlDevice_st *d = NULL;
    int idx = handle_index(device);
    nvmlReturn_t rc = enter(FN_LIMIT_CONSTRAINTS, idx);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    rc = device_locked(idx, &d);
    if (rc == NVML_SUCCESS && (minLimit == NULL || maxLimit == NULL))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        *minLimit = d->min_mw;
        *maxLimit = d->max_mw;
    }
    unlock();
    return rc;
}

nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t device, unsigned int limit)
{
    struct nvmlDevice_st *d = NULL;
    struct log_entry entry;
    int idx = handle_index(device);
    nvmlReturn_t rc = enter(FN_SET_LIMIT, idx);

    lock();
    if (rc == NVML_SUCCESS) {
        rc = device_locked(idx, &d);
        if (rc == NVML_SUCCESS && (limit < d->min_mw || limit > d->max_mw))
            rc = NVML_ERROR_INVALID_ARGUMENT;
        if (rc == NVML_SUCCESS) {
            d->current_mw = limit;
            save_limits_locked();
        }
    }
    /* Every call that reached the library is logged, failed or not. */
    memset(&entry, 0, sizeof entry);
    entry.device = idx;
    if (idx >= 0)
        snprintf(entry.uuid, sizeof entry.uuid, "%s", g_devs[idx].uuid);
    entry.milliwatts = limit;
    entry.rc = (int)rc;
    if (g_log_len < MAX_LOG)
        g_log[g_log_len++] = entry;
    if (g_log_file != NULL) {
        fprintf(g_log_file, "set_limit device=%d uuid=%s milliwatts=%u rc=%d\n", entry.device,
                entry.uuid[0] != '\0' ? entry.uuid : "-", entry.milliwatts, entry.rc);
        fflush(g_log_file);
    }
    unlock();
    return rc;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    struct nvmlDevice_st *d = NULL;
    int idx = handle_index(device);
    unsigned int i;
    nvmlReturn_t rc = enter(FN_PROCESSES, idx);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    rc = device_locked(idx, &d);
    if (rc == NVML_SUCCESS && infoCount == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        /* Real NVML: too small a buffer reports the needed count. */
        if (*infoCount < d->npids || (infos == NULL && d->npids > 0)) {
            *infoCount = d->npids;
            rc = NVML_ERROR_INSUFFICIENT_SIZE;
        } else {
            for (i = 0; i < d->npids; i++) {
                infos[i].pid = d->pids[i];
                infos[i].usedGpuMemory = 1ULL << 30;
                infos[i].gpuInstanceId = 0xFFFFFFFFU;
                infos[i].computeInstanceId = 0xFFFFFFFFU;
            }
            *infoCount = d->npids;
        }
    }
    unlock();
    return rc;
}
