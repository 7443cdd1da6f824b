/* A stand-in for NVIDIA's management library (libnvidia-ml.so.1) on a machine with no
 * GPU, so that the launcher's host-GPU guard runs through the real nvidia-ml-py against
 * a host that "has" GPUs. It is as strict as the real library where the launcher leans on
 * it: nothing answers before nvmlInit, an index past the count is an error, a name buffer
 * too small is an error, and a handle is only what GetHandleByIndex gave.
 *
 * The devices come from FAKE_NVML_GPUS, read at nvmlInit: names separated by ';'
 * (e.g. "Tesla T4;Tesla T4"); unset or empty: no device. FAKE_NVML_INIT_ERROR=<code>
 * makes nvmlInit fail with that NVML return code (e.g. 9, DRIVER_NOT_LOADED).
 * Built by tests/gpuhost.py with the system's cc; loaded by name through LD_LIBRARY_PATH,
 * as the real one is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 64
#define NAME_LEN 96

enum { OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, INSUFFICIENT_SIZE = 7, NOT_FOUND = 6 };

static char names[MAX_DEVICES][NAME_LEN];
static int count = -1; /* -1: not initialised */

typedef struct { int index; } device_t;
static device_t devices[MAX_DEVICES];

static int init(void) {
    const char *fail = getenv("FAKE_NVML_INIT_ERROR");
    if (fail && *fail) return atoi(fail);
    count = 0;
    const char *spec = getenv("FAKE_NVML_GPUS");
    if (!spec) return OK;
    const char *p = spec;
    while (*p && count < MAX_DEVICES) {
        const char *end = strchr(p, ';');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > 0) {
            if (n >= NAME_LEN) n = NAME_LEN - 1;
            memcpy(names[count], p, n);
            names[count][n] = 0;
            devices[count].index = count;
            count++;
        }
        if (!end) break;
        p = end + 1;
    }
    return OK;
}

int nvmlInit_v2(void) { return init(); }
int nvmlInitWithFlags(unsigned int flags) { (void)flags; return init(); }
int nvmlShutdown(void) {
    if (count < 0) return UNINITIALIZED;
    count = -1;
    return OK;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case OK: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_FOUND: return "Not Found";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

int nvmlDeviceGetCount_v2(unsigned int *out) {
    if (count < 0) return UNINITIALIZED;
    if (!out) return INVALID_ARGUMENT;
    *out = (unsigned int)count;
    return OK;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, device_t **out) {
    if (count < 0) return UNINITIALIZED;
    if (!out || index >= (unsigned int)count) return INVALID_ARGUMENT;
    *out = &devices[index];
    return OK;
}

static int valid(device_t *d) {
    return d >= devices && d < devices + count && d->index == (int)(d - devices);
}

int nvmlDeviceGetName(device_t *d, char *buf, unsigned int len) {
    if (count < 0) return UNINITIALIZED;
    if (!valid(d) || !buf) return INVALID_ARGUMENT;
    if (strlen(names[d->index]) + 1 > len) return INSUFFICIENT_SIZE;
    strcpy(buf, names[d->index]);
    return OK;
}

int nvmlDeviceGetUUID(device_t *d, char *buf, unsigned int len) {
    if (count < 0) return UNINITIALIZED;
    if (!valid(d) || !buf) return INVALID_ARGUMENT;
    char uuid[96];
    snprintf(uuid, sizeof uuid, "GPU-fa4e0000-0000-0000-0000-%012d", d->index);
    if (strlen(uuid) + 1 > len) return INSUFFICIENT_SIZE;
    strcpy(buf, uuid);
    return OK;
}
