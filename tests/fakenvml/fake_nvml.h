/*
 * fake_nvml.h - internal to the fake libnvidia-ml.so.1 (see fake_nvml.c).
 *
 * Shared state and helpers of the fake's translation units. Everything
 * declared here has hidden visibility: the library exports only the NVML
 * entry points and the fakenvml_* control API.
 */
#ifndef FAKE_NVML_H
#define FAKE_NVML_H

#include <nvml.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define FAKE_API_VERSION 2
/* build.py passes the hash of source, header and flags, so a test can tell a
 * stale library mapped in its process from the one just built. */
#ifndef FAKENVML_BUILD_ID
#define FAKENVML_BUILD_ID "unknown"
#endif
#define MAX_DEVICES 64
#define MAX_PIDS 1024
#define MAX_FAULTS 128
#define MAX_LOG 4096
#define UUID_LEN NVML_DEVICE_UUID_V2_BUFFER_SIZE
#define ANY_DEVICE (-1)

#define DEFAULT_DEVICE_COUNT 2
#define DEFAULT_MIN_MW 100000U
#define DEFAULT_MAX_MW 400000U
#define DEFAULT_LIMIT_MW 300000U
#define DEFAULT_DRAW_MW 150000U
/* The event types the fake can deliver; what a device supports by default. */
#define DEFAULT_EVENT_TYPES (nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError)
#define MAX_EVENT_SETS 16
#define MAX_EVENTS 16384 /* queued, not yet delivered; more are dropped and counted */
#define NO_INSTANCE 0xFFFFFFFFU

struct nvmlDevice_st {
    char uuid[UUID_LEN];
    unsigned int min_mw;
    unsigned int max_mw;
    unsigned int default_mw;
    unsigned int current_mw;
    unsigned int npids;
    unsigned int pids[MAX_PIDS];
    int uuid_change_pending;
    unsigned int uuid_change_after; /* calls still to answer with the old UUID */
    char next_uuid[UUID_LEN];
    /* Health (fake_nvml_health.c). */
    unsigned int draw_mw;
    int enforced_follows; /* the enforced limit is the current limit (default) */
    unsigned int enforced_mw;
    unsigned long long clocks_mask;
    unsigned long long ecc_volatile; /* uncorrected, volatile */
    unsigned int remap_pending;
    unsigned int remap_failure;
    int older_part; /* no row remapping (NOT_SUPPORTED); page retirement instead */
    int retired_pending;
    int lost; /* every call naming the device: NVML_ERROR_GPU_IS_LOST */
    unsigned long long supported_events;
};

/* An event set (fake_nvml_events.c): the event types registered per device. */
struct nvmlEventSet_st {
    int used;
    unsigned long generation; /* bumped when freed, so a waiter notices */
    unsigned long long registered[MAX_DEVICES];
};

enum fn_id {
    FN_INIT,
    FN_SHUTDOWN,
    FN_DRIVER_VERSION,
    FN_NVML_VERSION,
    FN_COUNT,
    FN_HANDLE_BY_INDEX,
    FN_UUID,
    FN_LIMIT_CONSTRAINTS,
    FN_DEFAULT_LIMIT,
    FN_LIMIT,
    FN_SET_LIMIT,
    FN_PROCESSES,
    FN_POWER_USAGE,
    FN_ENFORCED_LIMIT,
    FN_CLOCKS_EVENT_REASONS,
    FN_TOTAL_ECC,
    FN_REMAPPED_ROWS,
    FN_RETIRED_PENDING,
    FN_DEVICE_INDEX,
    FN_EVENT_SET_CREATE,
    FN_REGISTER_EVENTS,
    FN_SUPPORTED_EVENTS,
    FN_EVENT_WAIT,
    FN_EVENT_SET_FREE,
    FN_CLOCKS_THROTTLE_REASONS, /* the name drivers before 535 have */
    FN__COUNT,
    FN_ANY = -1,
    FN_UNKNOWN = -2
};

struct fault {
    int used;
    int fn; /* enum fn_id or FN_ANY */
    int device; /* index or ANY_DEVICE */
    int rc;
    long remaining; /* matching calls still to fail; -1 = forever */
    long skip; /* matching calls still to let through first */
    double hang_s;
};

struct log_entry {
    int device;
    char uuid[UUID_LEN];
    unsigned int milliwatts;
    int rc;
};

#define FAKE_INTERNAL __attribute__((visibility("hidden")))

/* State (fake_nvml_state.c); every access holds g_lock, taken through lock(). */
FAKE_INTERNAL extern struct nvmlDevice_st g_devs[MAX_DEVICES];
FAKE_INTERNAL extern unsigned int g_count;
FAKE_INTERNAL extern int g_refcount;
FAKE_INTERNAL extern int g_config_loaded; /* FAKE_NVML_CONFIG considered since the last reset */
FAKE_INTERNAL extern int g_config_broken;
FAKE_INTERNAL extern struct fault g_faults[MAX_FAULTS];
FAKE_INTERNAL extern struct log_entry g_log[MAX_LOG];
FAKE_INTERNAL extern unsigned int g_log_len;
FAKE_INTERNAL extern unsigned long g_calls[FN__COUNT][MAX_DEVICES + 1]; /* last: no device */
FAKE_INTERNAL extern FILE *g_log_file;
/* limits_file: where the devices' current limits live between processes ("" : none). */
FAKE_INTERNAL extern char g_limits_path[4096];
FAKE_INTERNAL void save_limits_locked(void);

/* fake_nvml_state.c */
FAKE_INTERNAL void lock(void);
FAKE_INTERNAL void unlock(void);
FAKE_INTERNAL void reset_locked(void);
FAKE_INTERNAL nvmlReturn_t enter(enum fn_id fn, int device);
FAKE_INTERNAL int handle_index(nvmlDevice_t device);
FAKE_INTERNAL nvmlReturn_t device_locked(int index, struct nvmlDevice_st **out);
FAKE_INTERNAL int add_fault(int fn, int device, int rc, long times, long after, double hang_s);
FAKE_INTERNAL int set_count_locked(unsigned int n);
FAKE_INTERNAL int copy_uuid(char *dst, const char *src);
/* Condition variable on the state mutex (CLOCK_MONOTONIC): event waits. */
FAKE_INTERNAL int wait_until_locked(const struct timespec *deadline); /* 0 or ETIMEDOUT */
FAKE_INTERNAL void wake_all_locked(void);
FAKE_INTERNAL void monotonic_deadline(unsigned int ms, struct timespec *out);

/* fake_nvml_events.c */
FAKE_INTERNAL void events_reset_locked(void); /* free every set, drop the queue */
FAKE_INTERNAL void free_all_sets_locked(void); /* at the last nvmlShutdown */
FAKE_INTERNAL int queue_event_locked(int device, unsigned long long type,
                                     unsigned long long data, unsigned int count);
FAKE_INTERNAL int event_type_parse(const char *token, unsigned long long *out);

/* fake_nvml_names.c */
FAKE_INTERNAL int fn_lookup(const char *name);
FAKE_INTERNAL int rc_parse(const char *token);

/* fake_nvml_config.c */
FAKE_INTERNAL int load_config_locked(const char *path);
FAKE_INTERNAL void load_env_config_locked(void);

/*
 * The control API (exported; fake_nvml_control.c, _names.c, _config.c).
 * Returns: 0 = done, -1 = rejected (bad index, name, value), unless noted.
 * Wrapped for tests by tests/fakenvml/control.py.
 */
int fakenvml_api_version(void);
const char *fakenvml_build_id(void);
void fakenvml_reset(void); /* defaults; no faults, logs, counts or inits */
int fakenvml_set_device_count(unsigned int n);
int fakenvml_configure_device(unsigned int index, const char *uuid, unsigned int min_mw,
                              unsigned int max_mw, unsigned int default_mw,
                              unsigned int current_mw);
int fakenvml_set_processes(unsigned int index, const unsigned int *pids, unsigned int n);
/* device -1: any; times -1: always; hang_seconds 0: no hang */
int fakenvml_inject(const char *function, int device, int rc, long times, long after,
                    double hang_seconds);
void fakenvml_clear_faults(void); /* also pending UUID changes */
int fakenvml_change_uuid(unsigned int index, unsigned int after_calls, const char *new_uuid);
unsigned int fakenvml_write_log_count(void);
int fakenvml_write_log_entry(unsigned int i, int *device, unsigned int *milliwatts, int *rc,
                             char *uuid, unsigned int uuid_len);
long fakenvml_limit(unsigned int index); /* current limit in mW, or -1 */
int fakenvml_device_uuid(unsigned int index, char *uuid, unsigned int uuid_len);
long fakenvml_call_count(const char *function, int device); /* device -1: all; -1 if unknown */
int fakenvml_init_count(void); /* nvmlInit calls not yet shut down */
int fakenvml_return_code(const char *name); /* nvmlReturn_t value, or -1 */
int fakenvml_load_config(const char *path); /* 0, -1 unreadable, or the bad line number */
/* Health (index < MAX_DEVICES; settings survive set_device_count within it). */
int fakenvml_set_power_draw(unsigned int index, unsigned int milliwatts);
int fakenvml_set_enforced_limit(unsigned int index, long milliwatts); /* < 0: the current limit */
int fakenvml_set_clocks_event_reasons(unsigned int index, unsigned long long mask);
int fakenvml_set_ecc_errors(unsigned int index, unsigned long long count);
/* Bump the volatile uncorrected ECC count; with_event: also queue a double-bit ECC event. */
int fakenvml_add_ecc_errors(unsigned int index, unsigned long long count, int with_event);
int fakenvml_set_row_remap(unsigned int index, int pending, int failure);
int fakenvml_set_older_part(unsigned int index, int older_part, int retired_pending);
int fakenvml_set_lost(unsigned int index, int lost); /* 0 restores, same UUID */
int fakenvml_set_supported_events(unsigned int index, unsigned long long mask);
/* Events: queue `count` events; returns how many fitted (the rest dropped), or -1. */
int fakenvml_queue_event(unsigned int index, unsigned long long type, unsigned long long data,
                         unsigned int count);
unsigned int fakenvml_pending_events(void);
unsigned long fakenvml_dropped_events(void);
unsigned long long fakenvml_registered_events(unsigned int index); /* OR over live sets */
int fakenvml_event_sets(void); /* live event sets */
int fakenvml_event_waiters(void); /* threads blocked in nvmlEventSetWait now */

#endif /* FAKE_NVML_H */
