/*
 * fake_nvml_health.c - the fake libnvidia-ml.so.1's health reads: power draw, the
 * enforced limit, clock-event reasons, ECC, row remapping and page retirement,
 * and nvmlDeviceGetIndex. Each runs the usual entry check (faults, call counts)
 * and answers GPU_IS_LOST for a lost device (device_locked).
 */

#include "fake_nvml.h"

/* Entry check and device lookup shared by every read here; on success the lock is held. */
static nvmlReturn_t begin(enum fn_id fn, nvmlDevice_t device, const void *out,
                          struct nvmlDevice_st **d)
{
    int idx = handle_index(device);
    nvmlReturn_t rc = enter(fn, idx);
    if (rc != NVML_SUCCESS)
        return rc;
    lock();
    rc = device_locked(idx, d);
    if (rc == NVML_SUCCESS && out == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        unlock();
    return rc;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    struct nvmlDevice_st *d = NULL;
    nvmlReturn_t rc = begin(FN_POWER_USAGE, device, power, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    *power = d->draw_mw;
    unlock();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    struct nvmlDevice_st *d = NULL;
    nvmlReturn_t rc = begin(FN_ENFORCED_LIMIT, device, limit, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    *limit = d->enforced_follows ? d->current_mw : d->enforced_mw;
    unlock();
    return NVML_SUCCESS;
}

/* Both names of the clock-event reasons read, each counted and faulted as its own function. */
static nvmlReturn_t clocks_reasons(enum fn_id which, nvmlDevice_t device, unsigned long long *mask)
{
    struct nvmlDevice_st *d = NULL;
    nvmlReturn_t rc = begin(which, device, mask, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    *mask = d->clocks_mask;
    unlock();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                    unsigned long long *clocksEventReasons)
{
    return clocks_reasons(FN_CLOCKS_EVENT_REASONS, device, clocksEventReasons);
}

/* The same reasons under the name older drivers export (deprecated in nvml.h). */
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                       unsigned long long *clocksThrottleReasons)
{
    return clocks_reasons(FN_CLOCKS_THROTTLE_REASONS, device, clocksThrottleReasons);
}

/* Uncorrected errors (volatile or aggregate) are the configured count; corrected: 0. */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType,
                                         unsigned long long *eccCounts)
{
    struct nvmlDevice_st *d = NULL;
    nvmlReturn_t rc = begin(FN_TOTAL_ECC, device, eccCounts, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if ((unsigned int)errorType >= NVML_MEMORY_ERROR_TYPE_COUNT ||
        (unsigned int)counterType >= NVML_ECC_COUNTER_TYPE_COUNT) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        *eccCounts = errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? d->ecc_volatile : 0;
    }
    unlock();
    return rc;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                       unsigned int *uncRows, unsigned int *isPending,
                                       unsigned int *failureOccurred)
{
    struct nvmlDevice_st *d = NULL;
    nvmlReturn_t rc;
    const void *all = (corrRows && uncRows && isPending && failureOccurred) ? corrRows : NULL;
    rc = begin(FN_REMAPPED_ROWS, device, all, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (d->older_part) {
        rc = NVML_ERROR_NOT_SUPPORTED; /* pre-Ampere: page retirement instead */
    } else {
        *corrRows = 0;
        *uncRows = d->remap_pending || d->remap_failure ? 1 : 0;
        *isPending = d->remap_pending;
        *failureOccurred = d->remap_failure;
    }
    unlock();
    return rc;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device,
                                                    nvmlEnableState_t *isPending)
{
    struct nvmlDevice_st *d = NULL;
    nvmlReturn_t rc = begin(FN_RETIRED_PENDING, device, isPending, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!d->older_part)
        rc = NVML_ERROR_NOT_SUPPORTED; /* row remapping replaced page retirement */
    else
        *isPending = d->retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    unlock();
    return rc;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    struct nvmlDevice_st *d = NULL;
    nvmlReturn_t rc = begin(FN_DEVICE_INDEX, device, index, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    *index = (unsigned int)handle_index(device);
    unlock();
    return NVML_SUCCESS;
}
