/*
 * fake_nvml_names.c - NVML function and return-code names for the fake libnvidia-ml.so.1:
 * parsing them (fault injection, config file) and nvmlErrorString.
 */

#include "fake_nvml.h"

static const struct {
    const char *name;
    enum fn_id id;
} FN_NAMES[] = {
    {"nvmlInit", FN_INIT},
    {"nvmlInit_v2", FN_INIT},
    {"nvmlInitWithFlags", FN_INIT},
    {"nvmlShutdown", FN_SHUTDOWN},
    {"nvmlSystemGetDriverVersion", FN_DRIVER_VERSION},
    {"nvmlSystemGetNVMLVersion", FN_NVML_VERSION},
    {"nvmlDeviceGetCount", FN_COUNT},
    {"nvmlDeviceGetCount_v2", FN_COUNT},
    {"nvmlDeviceGetHandleByIndex", FN_HANDLE_BY_INDEX},
    {"nvmlDeviceGetHandleByIndex_v2", FN_HANDLE_BY_INDEX},
    {"nvmlDeviceGetUUID", FN_UUID},
    {"nvmlDeviceGetPowerManagementLimitConstraints", FN_LIMIT_CONSTRAINTS},
    {"nvmlDeviceGetPowerManagementDefaultLimit", FN_DEFAULT_LIMIT},
    {"nvmlDeviceGetPowerManagementLimit", FN_LIMIT},
    {"nvmlDeviceSetPowerManagementLimit", FN_SET_LIMIT},
    {"nvmlDeviceGetComputeRunningProcesses", FN_PROCESSES},
    {"nvmlDeviceGetComputeRunningProcesses_v3", FN_PROCESSES},
    {"nvmlDeviceGetPowerUsage", FN_POWER_USAGE},
    {"nvmlDeviceGetEnforcedPowerLimit", FN_ENFORCED_LIMIT},
    {"nvmlDeviceGetCurrentClocksEventReasons", FN_CLOCKS_EVENT_REASONS},
    {"nvmlDeviceGetCurrentClocksThrottleReasons", FN_CLOCKS_THROTTLE_REASONS},
    {"nvmlDeviceGetTotalEccErrors", FN_TOTAL_ECC},
    {"nvmlDeviceGetRemappedRows", FN_REMAPPED_ROWS},
    {"nvmlDeviceGetRetiredPagesPendingStatus", FN_RETIRED_PENDING},
    {"nvmlDeviceGetIndex", FN_DEVICE_INDEX},
    {"nvmlEventSetCreate", FN_EVENT_SET_CREATE},
    {"nvmlDeviceRegisterEvents", FN_REGISTER_EVENTS},
    {"nvmlDeviceGetSupportedEventTypes", FN_SUPPORTED_EVENTS},
    {"nvmlEventSetWait", FN_EVENT_WAIT},
    {"nvmlEventSetWait_v2", FN_EVENT_WAIT},
    {"nvmlEventSetFree", FN_EVENT_SET_FREE},
};

/* Return-code names come from the official header's enum, never retyped. */
#define RC_ENTRY(code, text) {code, #code, text}
static const struct {
    nvmlReturn_t code;
    const char *name;
    const char *text;
} RC_NAMES[] = {
    RC_ENTRY(NVML_SUCCESS, "Success"),
    RC_ENTRY(NVML_ERROR_UNINITIALIZED, "Uninitialized"),
    RC_ENTRY(NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"),
    RC_ENTRY(NVML_ERROR_NOT_SUPPORTED, "Not Supported"),
    RC_ENTRY(NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"),
    RC_ENTRY(NVML_ERROR_ALREADY_INITIALIZED, "Already Initialized"),
    RC_ENTRY(NVML_ERROR_NOT_FOUND, "Not Found"),
    RC_ENTRY(NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"),
    RC_ENTRY(NVML_ERROR_INSUFFICIENT_POWER, "Insufficient External Power"),
    RC_ENTRY(NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    RC_ENTRY(NVML_ERROR_TIMEOUT, "Timeout"),
    RC_ENTRY(NVML_ERROR_IRQ_ISSUE, "Interrupt Request Issue"),
    RC_ENTRY(NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
    RC_ENTRY(NVML_ERROR_FUNCTION_NOT_FOUND, "Function Not Found"),
    RC_ENTRY(NVML_ERROR_CORRUPTED_INFOROM, "Corrupted infoROM"),
    RC_ENTRY(NVML_ERROR_GPU_IS_LOST, "GPU is lost"),
    RC_ENTRY(NVML_ERROR_RESET_REQUIRED, "GPU requires restart"),
    RC_ENTRY(NVML_ERROR_OPERATING_SYSTEM, "The operating system has blocked the request"),
    RC_ENTRY(NVML_ERROR_LIB_RM_VERSION_MISMATCH, "RM has detected an NVML/RM version mismatch"),
    RC_ENTRY(NVML_ERROR_IN_USE, "GPU is in use"),
    RC_ENTRY(NVML_ERROR_MEMORY, "Insufficient Memory"),
    RC_ENTRY(NVML_ERROR_NO_DATA, "No data"),
    RC_ENTRY(NVML_ERROR_VGPU_ECC_NOT_SUPPORTED, "vGPU ECC not supported"),
    RC_ENTRY(NVML_ERROR_INSUFFICIENT_RESOURCES, "Insufficient resources"),
    RC_ENTRY(NVML_ERROR_FREQ_NOT_SUPPORTED, "Frequency not supported"),
    RC_ENTRY(NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "Argument version mismatch"),
    RC_ENTRY(NVML_ERROR_DEPRECATED, "Deprecated"),
    RC_ENTRY(NVML_ERROR_NOT_READY, "Not ready"),
    RC_ENTRY(NVML_ERROR_GPU_NOT_FOUND, "GPU not found"),
    RC_ENTRY(NVML_ERROR_INVALID_STATE, "Invalid state"),
    RC_ENTRY(NVML_ERROR_UNKNOWN, "Unknown Error"),
};

int fn_lookup(const char *name)
{
    size_t i;
    if (name == NULL)
        return FN_UNKNOWN;
    if (strcmp(name, "*") == 0)
        return FN_ANY;
    for (i = 0; i < sizeof FN_NAMES / sizeof FN_NAMES[0]; i++)
        if (strcmp(FN_NAMES[i].name, name) == 0)
            return (int)FN_NAMES[i].id;
    return FN_UNKNOWN;
}

/* Parse "NVML_ERROR_X", "X", "NVML_SUCCESS" or a decimal number; -1 if none. */
int rc_parse(const char *token)
{
    size_t i;
    char *end;
    long value;
    if (token == NULL || *token == '\0')
        return -1;
    for (i = 0; i < sizeof RC_NAMES / sizeof RC_NAMES[0]; i++) {
        const char *name = RC_NAMES[i].name;
        const char *bare = name + (strncmp(name, "NVML_ERROR_", 11) == 0 ? 11 : 5);
        if (strcasecmp(token, name) == 0 || strcasecmp(token, bare) == 0)
            return (int)RC_NAMES[i].code;
    }
    errno = 0;
    value = strtol(token, &end, 0);
    if (errno != 0 || *end != '\0' || value < 0 || value > 0x7fffffff)
        return -1;
    return (int)value;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    size_t i;
    for (i = 0; i < sizeof RC_NAMES / sizeof RC_NAMES[0]; i++)
        if (RC_NAMES[i].code == result)
            return RC_NAMES[i].text;
    return "Unknown Error";
}

int fakenvml_return_code(const char *name)
{
    return rc_parse(name);
}
