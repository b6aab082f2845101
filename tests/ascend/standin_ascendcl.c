/* A stand-in libascendcl for tests/ascend/ (harness.py): the five entry points tilebake's
 * Ascend launcher resolves, each appending one line to the file $STANDIN_ACL_LOG (the call, its
 * arguments, a launch's packed argument bytes in hex). $STANDIN_ACL_DEVICE: the device
 * aclrtGetDevice reports (default 0); $STANDIN_ACL_FAIL: the call that fails (load | launch). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int32_t id;
  uint32_t value[4];
} Attr;
typedef struct {
  Attr *attrs;
  size_t num_attrs;
} Cfg;

static FILE *log_file(void) {
  const char *path = getenv("STANDIN_ACL_LOG");
  return path ? fopen(path, "a") : NULL;
}

static int fails(const char *call) {
  const char *which = getenv("STANDIN_ACL_FAIL");
  return which && strcmp(which, call) == 0;
}

int32_t aclrtGetDevice(int32_t *device) {
  const char *d = getenv("STANDIN_ACL_DEVICE");
  *device = d ? atoi(d) : 0;
  return 0;
}

int32_t aclrtBinaryLoadFromData(const void *data, size_t size, const void *options, void **binary) {
  FILE *f = log_file();
  if (f) fprintf(f, "load %zu %.*s %d\n", size, (int)(size < 200 ? size : 200), (const char *)data, options == NULL), fclose(f);
  if (fails("load")) return 107000;
  *binary = malloc(1);
  return 0;
}

int32_t aclrtBinaryGetFunction(void *binary, const char *name, void **function) {
  FILE *f = log_file();
  if (f) fprintf(f, "function %s\n", name), fclose(f);
  *function = strdup(name); /* the handle is the entry name: the launch log shows which */
  return 0;
}

int32_t aclrtBinaryUnLoad(void *binary) { return 0; }

int32_t aclrtLaunchKernelWithHostArgs(void *function, uint32_t blocks, void *stream, Cfg *cfg, void *args,
                                      size_t size, void *placeholders, size_t num_placeholders) {
  FILE *f = log_file();
  if (f) {
    fprintf(f, "launch %s %u %p %zu", (const char *)function, blocks, stream, cfg ? cfg->num_attrs : 0);
    for (size_t i = 0; cfg && i < cfg->num_attrs; ++i) fprintf(f, " attr %d %u", cfg->attrs[i].id, cfg->attrs[i].value[0]);
    fprintf(f, " args %zu ", size);
    for (size_t i = 0; i < size; ++i) fprintf(f, "%02x", ((const unsigned char *)args)[i]);
    fprintf(f, " placeholders %p %zu\n", placeholders, num_placeholders);
    fclose(f);
  }
  return fails("launch") ? 507015 : 0;
}

const char *aclGetRecentErrMsg(void) { return "stand-in failure"; }
