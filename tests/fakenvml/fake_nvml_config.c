/*
 * fake_nvml_config.c - the fake libnvidia-ml.so.1's configuration file.
 *
 * Configuration file
 * ------------------
 * If the environment variable FAKE_NVML_CONFIG names a file, it is applied on
 * top of the current state at the first nvmlInit of the process (and again at
 * the first nvmlInit after fakenvml_reset). One directive per line; `#` starts
 * a comment; tokens are separated by whitespace; milliwatts everywhere.
 *
 *   devices N                       set the device count (new devices get defaults)
 *   device I [uuid=U] [min=MW] [max=MW] [default=MW] [current=MW]
 *            [draw=MW] [enforced=MW|current] [clocks=MASK] [ecc=N]
 *            [remap_pending=0|1] [remap_failure=0|1] [older_part=0|1]
 *            [retired_pending=0|1] [events=MASK] [lost=0|1]
 *                                   configure device I (extends the count to I+1):
 *                                   limits; power draw; enforced limit (default:
 *                                   the current limit); clock-event reason mask;
 *                                   volatile uncorrected ECC count; row remapping;
 *                                   an older part (no row remapping, page
 *                                   retirement); supported event types; lost
 *   event I TYPE [DATA] [count=N]   queue N (default 1) events on device I; TYPE
 *                                   is xid, dbe (double-bit ECC), sbe or a mask
 *                                   bit; DATA is the XID number (default 0)
 *   processes I [PID ...]           compute processes running on device I
 *   fault FN DEV RC [times=N] [after=K] [hang=SECONDS]
 *                                   calls of FN on device DEV return RC
 *   hang FN DEV SECONDS [rc=RC] [times=N] [after=K]
 *                                   calls of FN on DEV sleep, then fail with RC
 *                                   or (default) proceed normally
 *   uuid_change I AFTER NEWUUID     after AFTER more nvmlDeviceGetUUID calls on
 *                                   device I have returned the old UUID, device
 *                                   I's UUID becomes NEWUUID (re-enumeration)
 *   init_error RC                   shorthand for `fault nvmlInit * RC`
 *   log_file PATH                   append one line per set-limit call:
 *                                   "set_limit device=I uuid=U milliwatts=MW rc=RC"
 *   limits_file PATH                the devices' current limits live in PATH, as a
 *                                   GPU's live on the device, not in the process:
 *                                   read now ("UUID MILLIWATTS" lines; a device it
 *                                   does not list keeps its limit; put it after the
 *                                   device lines), rewritten whole (renamed into
 *                                   place) after every successful set-limit call
 *
 * FN is an NVML function name, versioned or not (nvmlDeviceGetCount and
 * nvmlDeviceGetCount_v2 are the same function; every init entry point is
 * nvmlInit), or `*` for every function. DEV is a device index or `*` (any
 * device, and the only value that matches functions without a device, such
 * as nvmlInit and nvmlDeviceGetCount). RC is an nvmlReturn_t name
 * (NVML_ERROR_NO_PERMISSION, or just NO_PERMISSION) or a number. times=N
 * limits the fault to N matching calls (default: every call); after=K lets K
 * matching calls through first. Faults are checked in the order they were
 * added; the first one that applies is used. A hang sleeps without holding the
 * library's mutex, so calls from other threads are not blocked by it.
 *
 * A malformed file makes every nvmlInit fail with NVML_ERROR_UNKNOWN (and
 * prints the line to stderr) until fakenvml_reset.
 */

#include "fake_nvml.h"

static int parse_ulong(const char *s, unsigned long max, unsigned long *out)
{
    char *end;
    unsigned long v;
    if (s == NULL || *s == '\0' || *s == '-')
        return -1;
    errno = 0;
    v = strtoul(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > max)
        return -1;
    *out = v;
    return 0;
}

/* Decimal or 0x-prefixed 64-bit value (masks, counts). */
static int parse_u64(const char *s, unsigned long long *out)
{
    char *end;
    unsigned long long v;
    if (s == NULL || *s == '\0' || *s == '-')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 0);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

static int parse_flag(const char *s, int *out)
{
    if (s == NULL || (strcmp(s, "0") != 0 && strcmp(s, "1") != 0))
        return -1;
    *out = s[0] == '1';
    return 0;
}

static int parse_device(const char *s, int *out)
{
    unsigned long v;
    if (s != NULL && (strcmp(s, "*") == 0 || strcmp(s, "any") == 0)) {
        *out = ANY_DEVICE;
        return 0;
    }
    if (parse_ulong(s, MAX_DEVICES - 1, &v) != 0)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_seconds(const char *s, double *out)
{
    char *end;
    double v;
    if (s == NULL || *s == '\0')
        return -1;
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || v < 0.0 || v > 3600.0)
        return -1;
    *out = v;
    return 0;
}

/* key=value option; returns the value if tok starts with key=, else NULL. */
static const char *option(const char *tok, const char *key)
{
    size_t n = strlen(key);
    if (strncmp(tok, key, n) == 0 && tok[n] == '=')
        return tok + n + 1;
    return NULL;
}

/* Options shared by `fault` and `hang`: times=, after=, hang=, rc=. */
static int fault_options(char **toks, int ntok, long *times, long *after, double *hang, int *rc)
{
    int i;
    for (i = 0; i < ntok; i++) {
        const char *v;
        unsigned long n;
        if ((v = option(toks[i], "times")) != NULL) {
            if (parse_ulong(v, 1000000000UL, &n) != 0 || n == 0)
                return -1;
            *times = (long)n;
        } else if ((v = option(toks[i], "after")) != NULL) {
            if (parse_ulong(v, 1000000000UL, &n) != 0)
                return -1;
            *after = (long)n;
        } else if ((v = option(toks[i], "hang")) != NULL) {
            if (parse_seconds(v, hang) != 0)
                return -1;
        } else if ((v = option(toks[i], "rc")) != NULL) {
            if ((*rc = rc_parse(v)) < 0)
                return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

/* The health options of `device`; 0 if tok was one and valid. */
static int health_option(const char *tok, struct nvmlDevice_st *d)
{
    const char *v;
    unsigned long mw;
    unsigned long long n;
    int flag;
    if ((v = option(tok, "draw")) != NULL && parse_ulong(v, UINT32_MAX, &mw) == 0) {
        d->draw_mw = (unsigned int)mw;
    } else if ((v = option(tok, "enforced")) != NULL) {
        d->enforced_follows = strcmp(v, "current") == 0;
        if (!d->enforced_follows && parse_ulong(v, UINT32_MAX, &mw) != 0)
            return -1;
        d->enforced_mw = d->enforced_follows ? 0 : (unsigned int)mw;
    } else if ((v = option(tok, "clocks")) != NULL && parse_u64(v, &n) == 0) {
        d->clocks_mask = n;
    } else if ((v = option(tok, "ecc")) != NULL && parse_u64(v, &n) == 0) {
        d->ecc_volatile = n;
    } else if ((v = option(tok, "events")) != NULL && parse_u64(v, &n) == 0) {
        d->supported_events = n;
    } else if ((v = option(tok, "remap_pending")) != NULL && parse_flag(v, &flag) == 0) {
        d->remap_pending = (unsigned int)flag;
    } else if ((v = option(tok, "remap_failure")) != NULL && parse_flag(v, &flag) == 0) {
        d->remap_failure = (unsigned int)flag;
    } else if ((v = option(tok, "older_part")) != NULL && parse_flag(v, &flag) == 0) {
        d->older_part = flag;
    } else if ((v = option(tok, "retired_pending")) != NULL && parse_flag(v, &flag) == 0) {
        d->retired_pending = flag;
    } else if ((v = option(tok, "lost")) != NULL && parse_flag(v, &flag) == 0) {
        d->lost = flag;
    } else {
        return -1;
    }
    return 0;
}

static int directive_event(char **toks, int ntok)
{
    int index, i;
    unsigned long long type, data = 0;
    unsigned long count = 1;
    if (ntok < 3 || parse_device(toks[1], &index) != 0 || index == ANY_DEVICE ||
        event_type_parse(toks[2], &type) != 0)
        return -1;
    for (i = 3; i < ntok; i++) {
        const char *v = option(toks[i], "count");
        if (v != NULL) {
            if (parse_ulong(v, MAX_EVENTS, &count) != 0 || count == 0)
                return -1;
        } else if (i != 3 || parse_u64(toks[i], &data) != 0) {
            return -1;
        }
    }
    return queue_event_locked(index, type, data, (unsigned int)count) == (int)count ? 0 : -1;
}

static int directive_device(char **toks, int ntok)
{
    int index, i;
    struct nvmlDevice_st d;
    if (ntok < 2 || parse_device(toks[1], &index) != 0 || index == ANY_DEVICE)
        return -1;
    if ((unsigned int)index >= g_count)
        set_count_locked((unsigned int)index + 1);
    d = g_devs[index];
    for (i = 2; i < ntok; i++) {
        const char *v;
        unsigned long mw;
        if ((v = option(toks[i], "uuid")) != NULL) {
            if (copy_uuid(d.uuid, v) != 0)
                return -1;
            continue;
        }
        if ((v = option(toks[i], "min")) != NULL && parse_ulong(v, UINT32_MAX, &mw) == 0)
            d.min_mw = (unsigned int)mw;
        else if ((v = option(toks[i], "max")) != NULL && parse_ulong(v, UINT32_MAX, &mw) == 0)
            d.max_mw = (unsigned int)mw;
        else if ((v = option(toks[i], "default")) != NULL &&
                 parse_ulong(v, UINT32_MAX, &mw) == 0)
            d.default_mw = (unsigned int)mw;
        else if ((v = option(toks[i], "current")) != NULL &&
                 parse_ulong(v, UINT32_MAX, &mw) == 0)
            d.current_mw = (unsigned int)mw;
        else if (health_option(toks[i], &d) != 0)
            return -1;
    }
    g_devs[index] = d;
    return 0;
}

static int directive_processes(char **toks, int ntok)
{
    int index, i;
    if (ntok < 2 || parse_device(toks[1], &index) != 0 || index == ANY_DEVICE)
        return -1;
    if (ntok - 2 > MAX_PIDS)
        return -1;
    for (i = 2; i < ntok; i++) {
        unsigned long pid;
        if (parse_ulong(toks[i], UINT32_MAX, &pid) != 0)
            return -1;
        g_devs[index].pids[i - 2] = (unsigned int)pid;
    }
    g_devs[index].npids = (unsigned int)(ntok - 2);
    return 0;
}

/* Each "UUID MILLIWATTS" line of PATH sets that device's current limit; a missing
 * file is no error (nothing written yet). 0, or -1 when a line is not one. */
static int load_limits_locked(const char *path)
{
    char line[256], uuid[UUID_LEN];
    unsigned long mw;
    unsigned int i;
    FILE *fp = fopen(path, "r");
    if (fp == NULL)
        return errno == ENOENT ? 0 : -1;
    while (fgets(line, sizeof line, fp) != NULL) {
        char *save = NULL;
        char *id = strtok_r(line, " \t\r\n", &save);
        char *value = strtok_r(NULL, " \t\r\n", &save);
        if (id == NULL)
            continue;
        if (value == NULL || copy_uuid(uuid, id) != 0 || parse_ulong(value, UINT32_MAX, &mw) != 0) {
            fclose(fp);
            return -1;
        }
        for (i = 0; i < MAX_DEVICES; i++)
            if (strcmp(g_devs[i].uuid, uuid) == 0)
                g_devs[i].current_mw = (unsigned int)mw;
    }
    fclose(fp);
    return 0;
}

static int apply_directive(char **toks, int ntok)
{
    const char *cmd = toks[0];
    unsigned long n;
    int fn, device, rc = NVML_SUCCESS;
    long times = -1, after = 0;
    double hang = 0.0;

    if (strcmp(cmd, "devices") == 0) {
        if (ntok != 2 || parse_ulong(toks[1], MAX_DEVICES, &n) != 0)
            return -1;
        return set_count_locked((unsigned int)n);
    }
    if (strcmp(cmd, "device") == 0)
        return directive_device(toks, ntok);
    if (strcmp(cmd, "processes") == 0)
        return directive_processes(toks, ntok);
    if (strcmp(cmd, "event") == 0)
        return directive_event(toks, ntok);
    if (strcmp(cmd, "fault") == 0) {
        if (ntok < 4 || (fn = fn_lookup(toks[1])) == FN_UNKNOWN ||
            parse_device(toks[2], &device) != 0 || (rc = rc_parse(toks[3])) < 0 ||
            fault_options(toks + 4, ntok - 4, &times, &after, &hang, &rc) != 0)
            return -1;
        return add_fault(fn, device, rc, times, after, hang);
    }
    if (strcmp(cmd, "hang") == 0) {
        if (ntok < 4 || (fn = fn_lookup(toks[1])) == FN_UNKNOWN ||
            parse_device(toks[2], &device) != 0 || parse_seconds(toks[3], &hang) != 0 ||
            fault_options(toks + 4, ntok - 4, &times, &after, &hang, &rc) != 0)
            return -1;
        return add_fault(fn, device, rc, times, after, hang);
    }
    if (strcmp(cmd, "uuid_change") == 0) {
        if (ntok != 4 || parse_device(toks[1], &device) != 0 || device == ANY_DEVICE ||
            parse_ulong(toks[2], UINT32_MAX, &n) != 0 ||
            copy_uuid(g_devs[device].next_uuid, toks[3]) != 0)
            return -1;
        g_devs[device].uuid_change_pending = 1;
        g_devs[device].uuid_change_after = (unsigned int)n;
        return 0;
    }
    if (strcmp(cmd, "init_error") == 0) {
        if (ntok != 2 || (rc = rc_parse(toks[1])) < 0)
            return -1;
        return add_fault(FN_INIT, ANY_DEVICE, rc, -1, 0, 0.0);
    }
    if (strcmp(cmd, "limits_file") == 0) {
        if (ntok != 2 || strlen(toks[1]) >= sizeof g_limits_path)
            return -1;
        snprintf(g_limits_path, sizeof g_limits_path, "%s", toks[1]);
        return load_limits_locked(toks[1]);
    }
    if (strcmp(cmd, "log_file") == 0) {
        if (ntok != 2)
            return -1;
        if (g_log_file != NULL)
            fclose(g_log_file);
        g_log_file = fopen(toks[1], "a");
        return g_log_file == NULL ? -1 : 0;
    }
    return -1;
}

/* 0 on success, -1 if unreadable, else the (1-based) number of the bad line. */
int load_config_locked(const char *path)
{
    char line[4096];
    char *toks[MAX_PIDS + 8];
    int lineno = 0;
    FILE *fp = fopen(path, "r");
    if (fp == NULL)
        return -1;
    while (fgets(line, sizeof line, fp) != NULL) {
        char *save = NULL, *tok, *hash;
        int ntok = 0;
        lineno++;
        if ((hash = strchr(line, '#')) != NULL)
            *hash = '\0';
        for (tok = strtok_r(line, " \t\r\n", &save); tok != NULL;
             tok = strtok_r(NULL, " \t\r\n", &save)) {
            if (ntok == (int)(sizeof toks / sizeof toks[0])) {
                fclose(fp);
                return lineno;
            }
            toks[ntok++] = tok;
        }
        if (ntok > 0 && apply_directive(toks, ntok) != 0) {
            fclose(fp);
            return lineno;
        }
    }
    fclose(fp);
    return 0;
}

void load_env_config_locked(void)
{
    const char *path;
    int rc;
    if (g_config_loaded)
        return;
    g_config_loaded = 1;
    path = getenv("FAKE_NVML_CONFIG");
    if (path == NULL || *path == '\0')
        return;
    rc = load_config_locked(path);
    if (rc != 0) {
        g_config_broken = 1;
        if (rc < 0)
            fprintf(stderr, "fake_nvml: cannot read FAKE_NVML_CONFIG=%s\n", path);
        else
            fprintf(stderr, "fake_nvml: FAKE_NVML_CONFIG=%s line %d is invalid\n", path, rc);
    }
}

int fakenvml_load_config(const char *path)
{
    int rc;
    if (path == NULL)
        return -1;
    lock();
    rc = load_config_locked(path);
    unlock();
    return rc;
}
