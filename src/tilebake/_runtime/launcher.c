/* tilebake._launcher: the one native piece of the runtime.
 *
 * Loads a cubin into a device's primary context and launches kernels from it
 * with cuLaunchKernel. Built against Python's stable ABI (3.10+), it links
 * neither libtorch nor libcuda: the driver is opened with dlopen on first use,
 * so one wheel serves every Python >= 3.10, every torch and every driver that
 * can run the cubins. Tensors arrive as raw device pointers (ints) and the
 * stream as torch's raw cudaStream_t (an int), so the per-call path is one
 * argument-packing loop and one driver call.
 */
#include "launcher.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

Driver cu;
static PyObject *DriverError; /* tilebake.errors.CudaDriverError, set by _set_error_type */

int raise_cu(CUresult rc, const char *what) {
  const char *name = "unknown", *text = "";
  if (cu.GetErrorName) cu.GetErrorName(rc, &name);
  if (cu.GetErrorString) cu.GetErrorString(rc, &text);
  PyErr_Format(DriverError ? DriverError : PyExc_RuntimeError, "%s failed: %s (%d): %s", what, name, rc, text);
  return -1;
}

int open_driver(void) {
  if (cu.LaunchKernel) return 0;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    PyErr_Format(PyExc_RuntimeError, "tilebake: cannot open the CUDA driver (libcuda.so.1): %s", dlerror());
    return -1;
  }
#define SYM(field, name)                                                                      \
  if (!(*(void **)&cu.field = dlsym(lib, name))) {                                            \
    PyErr_Format(PyExc_RuntimeError, "tilebake: CUDA driver lacks %s (driver too old)", name); \
    return -1;                                                                                \
  }
  SYM(Init, "cuInit")
  SYM(DeviceGet, "cuDeviceGet")
  SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
  SYM(CtxGetCurrent, "cuCtxGetCurrent")
  SYM(CtxPushCurrent, "cuCtxPushCurrent_v2")
  SYM(CtxPopCurrent, "cuCtxPopCurrent_v2")
  SYM(ModuleLoadData, "cuModuleLoadData")
  SYM(ModuleGetFunction, "cuModuleGetFunction")
  SYM(FuncSetAttribute, "cuFuncSetAttribute")
  SYM(MemsetD8Async, "cuMemsetD8Async")
  SYM(GetErrorName, "cuGetErrorName")
  SYM(GetErrorString, "cuGetErrorString")
  SYM(LaunchKernel, "cuLaunchKernel") /* last: it marks the table complete */
#undef SYM
  CUresult rc = cu.Init(0);
  if (rc != CUDA_SUCCESS) {
    cu.LaunchKernel = NULL;
    return raise_cu(rc, "cuInit");
  }
  return 0;
}

/* The cubin `image` loaded into device `ordinal`'s primary context (retained, never released: a
   module lives as long as the process). */
static int load_image(const char *image, int ordinal, CUmodule *module, CUcontext *ctx) {
  if (open_driver()) return -1;
  CUdevice dev;
  CUcontext popped;
  CUresult rc = cu.DeviceGet(&dev, ordinal);
  if (rc != CUDA_SUCCESS) return raise_cu(rc, "cuDeviceGet");
  rc = cu.DevicePrimaryCtxRetain(ctx, dev);
  if (rc != CUDA_SUCCESS) return raise_cu(rc, "cuDevicePrimaryCtxRetain");
  rc = cu.CtxPushCurrent(*ctx);
  if (rc != CUDA_SUCCESS) return raise_cu(rc, "cuCtxPushCurrent");
  rc = cu.ModuleLoadData(module, image);
  cu.CtxPopCurrent(&popped);
  return rc == CUDA_SUCCESS ? 0 : raise_cu(rc, "cuModuleLoadData");
}

/* A kernel handle for function `entry` of `module` (loaded in `ctx`). */
static PyObject *kernel_handle(CUmodule module, CUcontext ctx, const char *entry, int smem) {
  CUcontext popped;
  /* Plain malloc: PyMem_RawMalloc is not in the 3.10 limited API (undeclared there, an implicit
     int-returning call would truncate the pointer). */
  Loaded *k = malloc(sizeof(Loaded));
  if (!k) return PyErr_NoMemory();
  CUresult rc = cu.CtxPushCurrent(ctx);
  if (rc != CUDA_SUCCESS) return free(k), raise_cu(rc, "cuCtxPushCurrent"), NULL;
  rc = cu.ModuleGetFunction(&k->function, module, entry);
  const char *what = "cuModuleGetFunction";
  /* Kernels asking for more than 48 KiB of dynamic shared memory must opt in. */
  if (rc == CUDA_SUCCESS && smem > 48 * 1024)
    rc = cu.FuncSetAttribute(k->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
    what = "cuFuncSetAttribute";
  cu.CtxPopCurrent(&popped);
  if (rc != CUDA_SUCCESS) return free(k), raise_cu(rc, what), NULL;
  k->context = ctx;
  return PyLong_FromVoidPtr(k);
}

/* load_module(image: bytes, device: int) -> int module: a cubin of several kernels (the wheel's
   bundles), loaded once per device and shared by its kernels' handles. */
static PyObject *load_module(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "load_module(image, device)");
    return NULL;
  }
  const char *image = PyBytes_AsString(args[0]);
  int ordinal = (int)PyLong_AsLong(args[1]);
  if (!image || PyErr_Occurred()) return NULL;
  CUmodule module;
  CUcontext ctx;
  if (load_image(image, ordinal, &module, &ctx)) return NULL;
  return PyLong_FromVoidPtr(module);
}

/* get_kernel(module: int, entry: str, device: int, dynamic_smem: int) -> int handle */
static PyObject *get_kernel(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "get_kernel(module, entry, device, dynamic_smem)");
    return NULL;
  }
  CUmodule module = PyLong_AsVoidPtr(args[0]);
  const char *entry = PyUnicode_AsUTF8AndSize(args[1], NULL);
  int ordinal = (int)PyLong_AsLong(args[2]);
  int smem = (int)PyLong_AsLong(args[3]);
  if (!entry || PyErr_Occurred()) return NULL;
  if (!module) {
    PyErr_SetString(PyExc_ValueError, "get_kernel: module is null (load_module's result expected)");
    return NULL;
  }
  if (open_driver()) return NULL;
  CUdevice dev;
  CUcontext ctx;
  CUresult rc = cu.DeviceGet(&dev, ordinal);
  if (rc != CUDA_SUCCESS) return raise_cu(rc, "cuDeviceGet"), NULL;
  /* The module's own context: retaining it again only counts up a reference. */
  rc = cu.DevicePrimaryCtxRetain(&ctx, dev);
  if (rc != CUDA_SUCCESS) return raise_cu(rc, "cuDevicePrimaryCtxRetain"), NULL;
  return kernel_handle(module, ctx, entry, smem);
}

/* load(image: bytes, entry: str, device: int, dynamic_smem: int) -> int handle: a cubin of its
   own (bench/'s tuning candidates). */
static PyObject *load(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "load(image, entry, device, dynamic_smem)");
    return NULL;
  }
  const char *image = PyBytes_AsString(args[0]);
  const char *entry = PyUnicode_AsUTF8AndSize(args[1], NULL);
  int ordinal = (int)PyLong_AsLong(args[2]);
  int smem = (int)PyLong_AsLong(args[3]);
  if (!image || !entry || PyErr_Occurred()) return NULL;
  CUmodule module;
  CUcontext ctx;
  if (load_image(image, ordinal, &module, &ctx)) return NULL;
  return kernel_handle(module, ctx, entry, smem);
}

#define MAX_ARGS 72  /* mhc_multilayer_recompute: 6 pointers a layer x 11 + 6 */

/* launch(handle, grid: tuple3, block: tuple3, dynamic_smem, stream, signature: bytes, args: tuple)
 * signature has one letter per kernel parameter, in the kernel's order:
 * 'p' pointer, 'i' int32, 'l' int64, 'f' float32. */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "launch(handle, grid, block, dynamic_smem, stream, signature, args)");
    return NULL;
  }
  Loaded *k = PyLong_AsVoidPtr(args[0]);
  unsigned dims[6];
  for (int i = 0; i < 6; ++i) {
    PyObject *item = PyTuple_GetItem(args[1 + i / 3], i % 3);
    if (!item) return NULL;
    long value = PyLong_AsLong(item);
    if (value < 0 || value > 0x7fffffffL) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "launch dimension %ld out of range", value);
      return NULL;
    }
    dims[i] = (unsigned)value;
  }
  unsigned smem = (unsigned)PyLong_AsUnsignedLong(args[3]);
  CUstream stream = PyLong_AsVoidPtr(args[4]);
  char *sig;
  Py_ssize_t nparams;
  if (PyBytes_AsStringAndSize(args[5], &sig, &nparams) < 0) return NULL;
  PyObject *values = args[6];
  if (!PyTuple_Check(values) || PyTuple_Size(values) != nparams || nparams > MAX_ARGS) {
    PyErr_Format(PyExc_TypeError, "launch: expected a tuple of %zd kernel arguments", nparams);
    return NULL;
  }
  if (PyErr_Occurred()) return NULL;

  union {
    void *p;
    int32_t i;
    int64_t l;
    float f;
  } storage[MAX_ARGS];
  void *params[MAX_ARGS];
  for (Py_ssize_t i = 0; i < nparams; ++i) {
    PyObject *v = PyTuple_GetItem(values, i);
    switch (sig[i]) {
      case 'p': storage[i].p = PyLong_AsVoidPtr(v); break;
      case 'i': {
        long x = PyLong_AsLong(v);
        if (x < INT32_MIN || x > INT32_MAX) {
          if (!PyErr_Occurred()) PyErr_Format(PyExc_OverflowError, "kernel argument %zd (%ld) does not fit int32", i, x);
          return NULL;
        }
        storage[i].i = (int32_t)x;
        break;
      }
      case 'l': storage[i].l = PyLong_AsLongLong(v); break;
      case 'f': storage[i].f = (float)PyFloat_AsDouble(v); break;
      default: PyErr_Format(PyExc_ValueError, "launch: bad signature letter %c", sig[i]); return NULL;
    }
    params[i] = &storage[i];
  }
  if (PyErr_Occurred()) return NULL;
  if (dims[0] == 0 || dims[1] == 0 || dims[2] == 0) Py_RETURN_NONE; /* empty problem: nothing to launch */

  if (launch_loaded(k, dims, smem, stream, params)) return NULL;
  Py_RETURN_NONE;
}

int launch_loaded(Loaded *k, const unsigned dims[6], unsigned smem, CUstream stream, void **params) {
  /* torch keeps the current device's primary context current; push the kernel's
   * own context only when the caller's thread has another one. */
  CUcontext current = NULL, popped;
  cu.CtxGetCurrent(&current);
  int pushed = current != k->context;
  if (pushed) {
    CUresult rc = cu.CtxPushCurrent(k->context);
    if (rc != CUDA_SUCCESS) return raise_cu(rc, "cuCtxPushCurrent");
  }
  CUresult rc =
      cu.LaunchKernel(k->function, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], smem, stream, params, NULL);
  if (pushed) cu.CtxPopCurrent(&popped);
  return rc == CUDA_SUCCESS ? 0 : raise_cu(rc, "cuLaunchKernel");
}

/* _set_error_type(cls): the exception class raised for driver errors. */
static PyObject *set_error_type(PyObject *self, PyObject *cls) {
  Py_XDECREF(DriverError);
  Py_INCREF(cls);
  DriverError = cls;
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"load", (PyCFunction)(void (*)(void))load, METH_FASTCALL, "Load a cubin on a device; returns a kernel handle."},
    {"load_module", (PyCFunction)(void (*)(void))load_module, METH_FASTCALL, "Load a cubin on a device; returns it."},
    {"get_kernel", (PyCFunction)(void (*)(void))get_kernel, METH_FASTCALL, "A kernel handle of a loaded cubin."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "Launch a loaded kernel on a stream."},
    {"plan", (PyCFunction)(void (*)(void))plan_new, METH_FASTCALL, "Compile a call plan (tilebake/_runtime/plan.py)."},
    {"run", (PyCFunction)(void (*)(void))plan_run, METH_FASTCALL, "run(plan, *tensors): one op call in C."},
    {"trace", (PyCFunction)(void (*)(void))plan_trace, METH_FASTCALL, "trace(plan, *tensors): run without launching."},
    {"_set_error_type", set_error_type, METH_O, "Set the exception class for driver errors."},
    {"acl_load", (PyCFunction)(void (*)(void))acl_load, METH_FASTCALL, "Load an Ascend binary; a function handle."},
    {"acl_launch", (PyCFunction)(void (*)(void))acl_launch, METH_FASTCALL, "Launch an Ascend kernel on a stream."},
    {"_set_acl_error_type", set_acl_error_type, METH_O, "Set the exception class for ACL errors."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_launcher", NULL, -1, methods};

PyMODINIT_FUNC PyInit__launcher(void) { return PyModule_Create(&module_def); }
