/* What the two native files of tilebake._launcher share: the driver entry points (opened with
 * dlopen by launcher.c) and the loaded-kernel handle. */
#ifndef TILEBAKE_LAUNCHER_H
#define TILEBAKE_LAUNCHER_H
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030A0000
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

/* The few driver API types and entry points used, declared here so the build
 * needs no CUDA headers (values from cuda.h, stable since CUDA 4). */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
enum { CUDA_SUCCESS = 0, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 };
typedef unsigned long long CUdeviceptr;

typedef struct {
  CUresult (*Init)(unsigned int);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*CtxGetCurrent)(CUcontext *);
  CUresult (*CtxPushCurrent)(CUcontext);
  CUresult (*CtxPopCurrent)(CUcontext *);
  CUresult (*ModuleLoadData)(CUmodule *, const void *);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*FuncSetAttribute)(CUfunction, int, int);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void **, void **);
  CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*GetErrorName)(CUresult, const char **);
  CUresult (*GetErrorString)(CUresult, const char **);
} Driver;

extern Driver cu;

/* A loaded kernel: the function and the context it belongs to. Never freed:
 * a kernel is loaded once per device and lives as long as the process. */
typedef struct {
  CUfunction function;
  CUcontext context;
} Loaded;

int raise_cu(CUresult rc, const char *what); /* sets a Python error, returns -1 */
int open_driver(void);                       /* 0, or -1 with a Python error set */
/* cuLaunchKernel in the kernel's context (pushed only when another one is current). */
int launch_loaded(Loaded *k, const unsigned dims[6], unsigned smem, CUstream stream, void **params);

/* native_call.c: the call plans (module functions of _launcher). */
PyObject *plan_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *plan_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *plan_trace(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* acl_launcher.c: the Ascend kernels (libascendcl opened with dlopen on first use). */
PyObject *acl_load(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *acl_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *set_acl_error_type(PyObject *self, PyObject *cls);
#endif
