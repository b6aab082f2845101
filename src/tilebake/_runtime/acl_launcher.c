/* tilebake._launcher's Ascend half: loads Ascend 950 kernel binaries (.aibin) and launches them
 * through libascendcl, resolved at run time (nothing linked at build time, as for libcuda).
 *
 * The call sequence and the argument packing follow ../shared/notes/ascend_aot.md: a binary is
 * loaded once per device with that device current (aclrtBinaryLoadFromData, then
 * aclrtBinaryGetFunction for the entry); a launch is aclrtLaunchKernelWithHostArgs with one host
 * buffer (8 bytes a pointer, each scalar aligned to max(its size, 4), the total rounded up to 8)
 * and, when the kernel uses unified-buffer bytes, one launch attribute (id 2: their count).
 * Written from the documented ACL facts; never run on an NPU here (tests/ascend/test_runtime.py
 * runs it against a stand-in libascendcl that records every call).
 */
#include "launcher.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef int32_t aclError;
typedef union {
  uint8_t schem_mode;
  uint32_t dyn_ubuf_size;
  uint32_t reserved[4];
} AclAttrValue;
typedef struct {
  int32_t id;
  AclAttrValue value;
} AclAttr;
typedef struct {
  AclAttr *attrs;
  size_t num_attrs;
} AclCfg;
enum { ACL_SUCCESS = 0, ACL_ATTR_DYN_UBUF_SIZE = 2, ACL_MAX_ARG_BYTES = 1024 };

static struct {
  aclError (*BinaryLoadFromData)(const void *, size_t, const void *, void **);
  aclError (*BinaryGetFunction)(void *, const char *, void **);
  aclError (*GetDevice)(int32_t *);
  aclError (*LaunchKernelWithHostArgs)(void *, uint32_t, void *, AclCfg *, void *, size_t, void *, size_t);
  const char *(*GetRecentErrMsg)(void); /* optional */
} acl;

static PyObject *AclError; /* tilebake.errors.AscendRuntimeError, set by _set_acl_error_type */

static int raise_acl(aclError rc, const char *what) {
  const char *msg = acl.GetRecentErrMsg ? acl.GetRecentErrMsg() : NULL;
  PyErr_Format(AclError ? AclError : PyExc_RuntimeError, "%s failed with ACL error %d%s%s", what, (int)rc,
               msg ? ": " : "", msg ? msg : "");
  return -1;
}

/* libascendcl: TILEBAKE_LIBASCENDCL (a path) if set; else the copy torch_npu already loaded (the
   process's global symbols); else libascendcl.so by name, then under $ASCEND_HOME_PATH/lib64. */
static int open_acl(void) {
  if (acl.LaunchKernelWithHostArgs) return 0;
  const char *forced = getenv("TILEBAKE_LIBASCENDCL");
  void *lib = NULL;
  if (forced && *forced) {
    lib = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
  } else if (dlsym(RTLD_DEFAULT, "aclrtLaunchKernelWithHostArgs")) {
    lib = RTLD_DEFAULT;
  } else if (!(lib = dlopen("libascendcl.so", RTLD_NOW | RTLD_GLOBAL))) {
    const char *home = getenv("ASCEND_HOME_PATH");
    char path[4096];
    if (home && snprintf(path, sizeof path, "%s/lib64/libascendcl.so", home) < (int)sizeof path)
      lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  }
  if (!lib) {
    PyErr_Format(PyExc_RuntimeError,
                 "tilebake: cannot open the Ascend runtime (libascendcl.so; set ASCEND_HOME_PATH or import torch_npu "
                 "first): %s", dlerror());
    return -1;
  }
#define SYM(field, name)                                                                                    \
  if (!(*(void **)&acl.field = dlsym(lib, name))) {                                                         \
    PyErr_Format(PyExc_RuntimeError, "tilebake: the Ascend runtime lacks %s (CANN 8.5 or newer needed)", name); \
    return -1;                                                                                              \
  }
  SYM(BinaryLoadFromData, "aclrtBinaryLoadFromData")
  SYM(BinaryGetFunction, "aclrtBinaryGetFunction")
  SYM(GetDevice, "aclrtGetDevice")
  SYM(LaunchKernelWithHostArgs, "aclrtLaunchKernelWithHostArgs") /* last: it marks the table complete */
#undef SYM
  *(void **)&acl.GetRecentErrMsg = dlsym(lib, "aclGetRecentErrMsg");
  return 0;
}

/* acl_load(image: bytes, entry: str, device: int) -> function handle (int). The binary is loaded
   with `device` current (the caller makes it so) and never unloaded: it lives as long as the
   process, as the CUDA modules do. */
PyObject *acl_load(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  char *image;
  Py_ssize_t size;
  if (nargs != 3 || PyBytes_AsStringAndSize(args[0], &image, &size) < 0 || !PyUnicode_Check(args[1])) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "acl_load(image, entry, device)");
    return NULL;
  }
  const char *entry = PyUnicode_AsUTF8AndSize(args[1], NULL);
  long device = PyLong_AsLong(args[2]);
  if (!entry || (device == -1 && PyErr_Occurred()) || open_acl()) return NULL;
  int32_t current = -1;
  aclError rc = acl.GetDevice(&current);
  if (rc != ACL_SUCCESS) return raise_acl(rc, "aclrtGetDevice"), NULL;
  if (current != device)
    return PyErr_Format(PyExc_RuntimeError, "tilebake: loading a kernel for npu:%ld while npu:%d is current", device,
                        (int)current);
  void *binary = NULL, *function = NULL;
  rc = acl.BinaryLoadFromData(image, (size_t)size, NULL, &binary);
  if (rc != ACL_SUCCESS) return raise_acl(rc, "aclrtBinaryLoadFromData"), NULL;
  rc = acl.BinaryGetFunction(binary, entry, &function);
  if (rc != ACL_SUCCESS) return raise_acl(rc, "aclrtBinaryGetFunction"), NULL;
  return PyLong_FromVoidPtr(function);
}

/* The kernel arguments in one host buffer; the packed size, or -1 with a Python error. */
static Py_ssize_t pack_args(const char *kinds, Py_ssize_t n, PyObject *const *values, unsigned char *out) {
  size_t offset = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    size_t width = kinds[i] == 'p' || kinds[i] == 'l' ? 8 : 4;
    offset = (offset + width - 1) & ~(width - 1); /* scalars: max(their size, 4); pointers: 8 */
    if (offset + width > ACL_MAX_ARG_BYTES) return PyErr_SetString(PyExc_ValueError, "tilebake: too many kernel arguments"), -1;
    if (kinds[i] == 'p' || kinds[i] == 'l') {
      int64_t v = kinds[i] == 'p' ? (int64_t)(uintptr_t)PyLong_AsVoidPtr(values[i]) : PyLong_AsLongLong(values[i]);
      memcpy(out + offset, &v, 8);
    } else if (kinds[i] == 'i') {
      long long v = PyLong_AsLongLong(values[i]);
      if (!PyErr_Occurred() && (v < INT32_MIN || v > INT32_MAX))
        return PyErr_Format(PyExc_OverflowError, "tilebake: kernel argument %zd (%lld) exceeds int32", i, v), -1;
      int32_t w = (int32_t)v;
      memcpy(out + offset, &w, 4);
    } else if (kinds[i] == 'f') {
      float f = (float)PyFloat_AsDouble(values[i]);
      memcpy(out + offset, &f, 4);
    } else {
      return PyErr_Format(PyExc_ValueError, "tilebake: unknown kernel argument kind %c", kinds[i]), -1;
    }
    if (PyErr_Occurred()) return -1;
    offset += width;
  }
  return (Py_ssize_t)((offset + 7) & ~(size_t)7);
}

/* acl_launch(function, blocks, stream, ub_bytes, kinds: bytes, *args): one launch on `stream`
   (torch_npu's raw aclrtStream, an int). */
PyObject *acl_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  char *kinds;
  Py_ssize_t nkinds;
  if (nargs < 5 || PyBytes_AsStringAndSize(args[4], &kinds, &nkinds) < 0 || nkinds != nargs - 5) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "acl_launch(function, blocks, stream, ub_bytes, kinds, *args)");
    return NULL;
  }
  void *function = PyLong_AsVoidPtr(args[0]);
  unsigned long blocks = PyLong_AsUnsignedLong(args[1]);
  void *stream = PyLong_AsVoidPtr(args[2]);
  unsigned long ub = PyLong_AsUnsignedLong(args[3]);
  if (PyErr_Occurred() || open_acl()) return NULL;
  _Alignas(8) unsigned char buffer[ACL_MAX_ARG_BYTES] = {0};
  Py_ssize_t size = pack_args(kinds, nkinds, args + 5, buffer);
  if (size < 0) return NULL;
  AclAttr attr;
  memset(&attr, 0, sizeof attr);
  attr.id = ACL_ATTR_DYN_UBUF_SIZE;
  attr.value.dyn_ubuf_size = (uint32_t)ub;
  AclCfg cfg = {&attr, 1};
  aclError rc = acl.LaunchKernelWithHostArgs(function, (uint32_t)blocks, stream, ub ? &cfg : NULL, buffer, (size_t)size,
                                             NULL, 0);
  if (rc != ACL_SUCCESS) return raise_acl(rc, "aclrtLaunchKernelWithHostArgs"), NULL;
  Py_RETURN_NONE;
}

/* _set_acl_error_type(cls): the exception class raised for ACL errors. */
PyObject *set_acl_error_type(PyObject *self, PyObject *cls) {
  Py_XDECREF(AclError);
  Py_INCREF(cls);
  AclError = cls;
  Py_RETURN_NONE;
}
