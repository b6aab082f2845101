/* tilebake._launcher's call plans: a whole op call (checks, output allocation, argument
 * packing, every launch) in C, without libtorch.
 *
 * A plan is a small program that tilebake/_runtime/plan.py compiles once per op and call key:
 * 64-bit words (opcodes below), float constants and one kernel resolver per kernel launched.
 * Tensors are read through torch's DLPack C exchange API (torch.Tensor.__dlpack_c_exchange_api__,
 * DLPack 1.3: a non-owning DLTensor view, torch's current stream); outputs are the first
 * tensor's new_empty, or torch.empty_like of a cached template (torch's own allocation: the
 * exchange API's allocator hands out tensors whose memory record_stream does not track). Any argument the plan does not expect (another
 * dtype, shape, stride, device, a tensor subclass, a failed allocation) makes run() return
 * NotImplemented without side effects: the caller then takes the Python path, which raises
 * the op's own typed error or handles the case. Driver errors raise CudaDriverError.
 */
#include "native_call.h"

#include <string.h>

static void plan_free(PyObject *capsule) {
  Plan *p = PyCapsule_GetPointer(capsule, "tilebake.plan");
  if (!p) return;
  free(p->code);
  free(p->floats);
  Py_XDECREF(p->resolvers);
  Py_XDECREF(p->bump);
  Py_XDECREF(p->tensor_type);
  Py_XDECREF(p->param_type);
  Py_XDECREF(p->alloc_kwargs);
  Py_XDECREF(p->empty_like);
  for (int s = 0; s < MAX_SLOTS; ++s) Py_XDECREF(p->templates[s].expanded);
  free(p);
}

/* plan(code: bytes, floats: tuple, resolvers: tuple, bump, tensor_type, param_type, alloc_kwargs, empty_like) -> capsule */
PyObject *plan_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  char *bytes;
  Py_ssize_t nbytes;
  if (nargs != 8 || !PyTuple_Check(args[6]) || PyBytes_AsStringAndSize(args[0], &bytes, &nbytes) < 0 || nbytes % 8 || !PyTuple_Check(args[1]) ||
      !PyTuple_Check(args[2]) || PyTuple_Size(args[2]) > MAX_KERNELS) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "plan(code, floats, resolvers, bump, tensor_type, param_type, alloc_kwargs, empty_like)");
    return NULL;
  }
  PyObject *capsule_obj = PyObject_GetAttrString(args[4], "__dlpack_c_exchange_api__");
  if (!capsule_obj) return NULL;
  const ExchangeAPI *api = PyCapsule_GetPointer(capsule_obj, "dlpack_exchange_api");
  Py_DECREF(capsule_obj);
  if (!api) return NULL;
  if (api->version.major != 1 || api->version.minor < 3 || !api->view_of_py) {
    PyErr_Format(PyExc_RuntimeError, "torch's DLPack exchange API is %u.%u; the native path needs 1.3+",
                 api->version.major, api->version.minor);
    return NULL;
  }
  Plan *p = calloc(1, sizeof(Plan));
  if (!p) return PyErr_NoMemory();
  p->ncode = nbytes / 8;
  p->code = malloc(nbytes ? nbytes : 8);
  Py_ssize_t nf = PyTuple_Size(args[1]);
  p->floats = malloc(sizeof(float) * (nf ? nf : 1));
  if (!p->code || !p->floats) return free(p->code), free(p->floats), free(p), PyErr_NoMemory();
  memcpy(p->code, bytes, nbytes);
  for (Py_ssize_t i = 0; i < nf; ++i) p->floats[i] = (float)PyFloat_AsDouble(PyTuple_GetItem(args[1], i));
  p->api = api;
  Py_INCREF(args[2]), p->resolvers = args[2];
  Py_INCREF(args[3]), p->bump = args[3];
  Py_INCREF(args[4]), p->tensor_type = args[4];
  Py_INCREF(args[5]), p->param_type = args[5];
  Py_INCREF(args[6]), p->alloc_kwargs = args[6];
  Py_INCREF(args[7]), p->empty_like = args[7];
  for (int s = 0; s < MAX_SLOTS; ++s) p->templates[s].device = -1;
  PyObject *capsule = PyCapsule_New(p, "tilebake.plan", plan_free);
  if (!capsule || PyErr_Occurred()) return Py_XDECREF(capsule), NULL; /* plan_free ran if created */
  return capsule;
}

/* Evaluate n tokens; 0 on success (*out set), 1 if not representable (division by zero). */
int plan_eval(const int64_t *tok, int64_t n, const int64_t *reg, int64_t *out) {
  int64_t stack[MAX_STACK];
  int top = 0;
  for (int64_t i = 0; i < n; ++i) {
    int op = (int)(tok[i] & 0xff);
    int64_t operand = tok[i] >> 8;
    if (op == T_REG || op == T_CONST) {
      if (top == MAX_STACK) return 1;
      stack[top++] = op == T_REG ? reg[operand] : operand;
      continue;
    }
    if (op == T_NOT) {
      if (top < 1) return 1;
      stack[top - 1] = !stack[top - 1];
      continue;
    }
    if (top < 2) return 1;
    int64_t b = stack[--top], a = stack[top - 1], r;
    switch (op) {
      case T_ADD: if (__builtin_add_overflow(a, b, &r)) return 1; break; /* out of range: Python decides */
      case T_SUB: if (__builtin_sub_overflow(a, b, &r)) return 1; break;
      case T_MUL: if (__builtin_mul_overflow(a, b, &r)) return 1; break;
      case T_FLOORDIV: /* Python's floor division and modulo */
      case T_MOD: {
        if (b == 0 || (a == INT64_MIN && b == -1)) return 1;
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) q -= 1, m += b;
        r = op == T_MOD ? m : q;
        break;
      }
      case T_MIN: r = a < b ? a : b; break;
      case T_MAX: r = a > b ? a : b; break;
      case T_EQ: r = a == b; break;
      case T_NE: r = a != b; break;
      case T_LT: r = a < b; break;
      case T_LE: r = a <= b; break;
      case T_AND: r = a && b; break;
      case T_OR: r = a || b; break;
      default: return 1;
    }
    stack[top - 1] = r;
  }
  if (top != 1) return 1;
  *out = stack[0];
  return 0;
}

Loaded *plan_handle(Plan *p, int64_t k, int device) {
  if (k < 0 || k >= PyTuple_Size(p->resolvers) || device < 0 || device >= MAX_DEVICES) return NULL;
  if (p->handles[k][device]) return p->handles[k][device];
  PyObject *h = PyObject_CallFunction(PyTuple_GetItem(p->resolvers, k), "i", device);
  if (!h) return NULL;
  p->handles[k][device] = h == Py_None ? NULL : PyLong_AsVoidPtr(h);
  Py_DECREF(h);
  return p->handles[k][device];
}

PyObject *plan_return(Call *c, const int64_t *tpl, int64_t n, int64_t *pos) {
  if (*pos >= n) return PyErr_SetString(PyExc_RuntimeError, "tilebake plan: bad return template"), NULL;
  int64_t kind = tpl[*pos] & 0xff, value = tpl[*pos] >> 8;
  ++*pos;
  if (kind == RET_NONE) Py_RETURN_NONE;
  if (kind == RET_SLOT) {
    PyObject *o = value >= 0 && value < MAX_SLOTS ? c->obj[value] : NULL;
    if (!o) return PyErr_SetString(PyExc_RuntimeError, "tilebake plan: returns an empty slot"), NULL;
    Py_INCREF(o);
    return o;
  }
  PyObject *t = PyTuple_New(value);
  for (int64_t i = 0; t && i < value; ++i) {
    PyObject *item = plan_return(c, tpl, n, pos);
    if (!item) return Py_DECREF(t), NULL;
    PyTuple_SetItem(t, i, item);
  }
  return t;
}

static PyObject *execute(PyObject *const *args, Py_ssize_t nargs, PyObject *trace) {
  if (nargs >= 1 && args[0] == Py_None) { /* no plan for this key (no exchange API): the Python path */
    Py_INCREF(Py_NotImplemented);
    return Py_NotImplemented;
  }
  Plan *p = nargs >= 1 ? PyCapsule_GetPointer(args[0], "tilebake.plan") : NULL;
  if (!p) return NULL;
  Call c;
  memset(c.obj, 0, sizeof c.obj);
  memset(c.owned, 0, sizeof c.owned);
  c.device = -1;
  c.like = NULL;
  c.stream = NULL;
  c.trace = trace;
  PyObject *result = NULL;
  int64_t pc = 0;
  int status = 0; /* 0 go on, 1 NotImplemented, -1 error, 2 returned */
  while (status == 0 && pc < p->ncode) status = plan_step(p, &c, args + 1, nargs - 1, &pc, &result);
  if (status == 0) status = 1; /* a program without OP_RETURN */
  if (status != 2)
    for (int s = 0; s < MAX_SLOTS; ++s)
      if (c.owned[s]) Py_DECREF(c.obj[s]);
  if (status == 2) {
    for (int s = 0; s < MAX_SLOTS; ++s)
      if (c.owned[s]) Py_DECREF(c.obj[s]); /* the result holds its own references */
    return result;
  }
  if (status == 1) {
    PyErr_Clear();
    Py_INCREF(Py_NotImplemented);
    return Py_NotImplemented;
  }
  return NULL;
}

/* run(plan, *tensors) -> the op's result, or NotImplemented */
PyObject *plan_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) { return execute(args, nargs, NULL); }

/* trace(plan, *tensors) -> (result, [(kernel, grid, block, smem, params), ...]): everything
 * but the launches (and memsets), on CPU tensors too; for the tests. */
PyObject *plan_trace(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PyObject *launches = PyList_New(0);
  if (!launches) return NULL;
  PyObject *result = execute(args, nargs, launches);
  if (!result) return Py_DECREF(launches), NULL;
  PyObject *pair = Py_BuildValue("(NN)", result, launches);
  return pair;
}
