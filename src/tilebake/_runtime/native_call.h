/* The call plans' shared definitions (native_call.c: plans and their execution; native_step.c:
 * one instruction). */
#ifndef TILEBAKE_NATIVE_CALL_H
#define TILEBAKE_NATIVE_CALL_H
#include "launcher.h"

#include <stdlib.h>

/* DLPack 1.3 (torch's include/ATen/dlpack.h), the parts used. */
typedef struct { uint32_t major, minor; } DLPackVersion;
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape, *strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
typedef struct {
  DLPackVersion version;
  void *prev_api;
  int (*allocate)(DLTensor *, DLManagedTensorVersioned **, void *, void (*)(void *, const char *, const char *));
  void *managed_from_py;
  int (*managed_to_py)(DLManagedTensorVersioned *, void **);
  int (*view_of_py)(void *, DLTensor *);
  int (*current_stream)(int32_t, int32_t, void **);
} ExchangeAPI;
enum { kDLCPU = 1, kDLCUDA = 2 };

/* Opcodes; operands follow each in the code. R: register, S: tensor slot. */
enum {
  OP_TENSOR = 1, /* arg S code bits lanes ndim align: args[arg] (or an item of it), a torch.Tensor */
  OP_SHAPE,      /* S dim R: R = shape[dim] */
  OP_STRIDE,     /* S dim R: R = strides[dim] (elements) */
  OP_PTR,        /* S R: R = data pointer */
  OP_EXPR,       /* R n tokens[n]: R = expression */
  OP_CHECK,      /* n tokens[n]: expression != 0, or NotImplemented */
  OP_ALLOC,      /* S dtype ndim R[ndim]: a new contiguous tensor of shape R[] (alloc_kwargs[dtype]) */
  OP_VIEW,       /* S ndim R[ndim] R[ndim]: S = S.as_strided(sizes, strides) */
  OP_DISJOINT,   /* S S: the two tensors' memory does not overlap, or NotImplemented */
  OP_ZERO,       /* S R: memset the first R bytes of S to 0 on the stream */
  OP_LAUNCH,     /* kernel n (kind R)[n] R[3] block[3] smem: kind 'p' 'i' 'l' 'f' (R: float index) */
  OP_BUMP,       /* n S[n]: each S's version counter + 1 (in-place or out= writes), one call */
  OP_RETURN,     /* n template[n]: RET_SLOT s | RET_TUPLE k | RET_NONE, prefix order */
  OP_DISJOINT_SET, /* ni no S[ni + no]: no output (the last no) overlaps an input or another output */
};
enum { T_REG, T_CONST, T_ADD, T_SUB, T_MUL, T_FLOORDIV, T_MOD, T_MIN, T_MAX, T_EQ, T_NE, T_LT, T_LE, T_AND, T_OR, T_NOT };
enum { RET_SLOT, RET_TUPLE, RET_NONE };
/* Registers, slots and parameters: mhc_multilayer_recompute's 11-layer plan (541 registers, 67
 * tensors, 72 kernel parameters). */
#define MAX_REGS 640
#define MAX_SLOTS 72
#define MAX_DIMS 6
#define MAX_KERNELS 8
#define MAX_DEVICES 64
#define MAX_PARAMS 80
#define MAX_STACK 32

/* An output's last shape (with its dtype and device) and, once seen twice in a row, a
 * one-element tensor of that dtype expanded to that shape: torch.empty_like of it is a new
 * contiguous tensor of the shape (not dense, so no strides to preserve), about 1.3 us cheaper
 * than new_empty(shape, dtype=...) on the H200 (bench/results/2026-12-01-NVIDIA-H200/session3/). */
typedef struct {
  int64_t dtype, ndim, shape[MAX_DIMS];
  int device; /* -1: nothing seen yet */
  PyObject *expanded;
} AllocTemplate;

typedef struct {
  int64_t *code;
  Py_ssize_t ncode;
  float *floats;
  PyObject *resolvers; /* tuple: resolvers[k](device) -> kernel handle (int) or None */
  PyObject *bump;      /* torch.autograd.graph.increment_version */
  PyObject *tensor_type; /* torch.Tensor */
  PyObject *param_type;  /* torch.nn.Parameter: a subclass that overrides nothing a kernel sees */
  PyObject *alloc_kwargs; /* tuple of {"dtype": ...}: the new_empty keywords of each output dtype */
  PyObject *empty_like;   /* torch.empty_like */
  AllocTemplate templates[MAX_SLOTS]; /* by the slot an OP_ALLOC writes */
  const ExchangeAPI *api;
  Loaded *handles[MAX_KERNELS][MAX_DEVICES];
} Plan;

typedef struct {
  DLTensor dl[MAX_SLOTS];
  PyObject *obj[MAX_SLOTS]; /* borrowed (arguments) or owned (allocated: owned[s]) */
  char owned[MAX_SLOTS];
  int64_t shape[MAX_SLOTS][MAX_DIMS], strides[MAX_SLOTS][MAX_DIMS]; /* allocated tensors' */
  int64_t reg[MAX_REGS];
  int device;   /* -1 until the first tensor */
  PyObject *like; /* the first tensor: outputs are its new_empty */
  void *stream; /* fetched at the first launch */
  PyObject *trace; /* trace(): a list receiving the launches instead of the driver */
} Call;

int plan_eval(const int64_t *tok, int64_t n, const int64_t *reg, int64_t *out);
Loaded *plan_handle(Plan *p, int64_t k, int device);
PyObject *plan_return(Call *c, const int64_t *tpl, int64_t n, int64_t *pos);
int plan_step(Plan *p, Call *c, PyObject *const *args, Py_ssize_t nargs, int64_t *pc, PyObject **result);
#endif
