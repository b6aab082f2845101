/* One instruction of a call plan (native_call.h lists the opcodes). */
#include "native_call.h"

#include <string.h>

#define NEED(k) \
  if (*pc + (k) > p->ncode) return bad_plan()
#define ARG(i) (code[*pc + (i)])


static int64_t itemsize(const DLTensor *t) { return (t->dtype.bits * t->dtype.lanes + 7) / 8; }

/* [lo, hi) byte extent of a tensor's elements; lo == hi when it has none. */
static void extent(const DLTensor *t, uintptr_t *lo, uintptr_t *hi) {
  int64_t low = 0, high = 0;
  for (int d = 0; d < t->ndim; ++d) {
    if (t->shape[d] == 0) {
      *lo = *hi = (uintptr_t)t->data;
      return;
    }
    int64_t span = (t->shape[d] - 1) * t->strides[d];
    if (span < 0) low += span; else high += span;
  }
  *lo = (uintptr_t)t->data + low * itemsize(t);
  *hi = (uintptr_t)t->data + (high + 1) * itemsize(t);
}

static int bad_plan(void) {
  PyErr_SetString(PyExc_RuntimeError, "tilebake: malformed call plan");
  return -1;
}

static int reg_ok(int64_t r) { return r >= 0 && r < MAX_REGS; }
static int slot_ok(int64_t s) { return s >= 0 && s < MAX_SLOTS; }

static int read_tensor(Plan *p, Call *c, PyObject *const *args, Py_ssize_t nargs, const int64_t *a) {
  /* a: arg slot code bits lanes ndim align; arg: index | (item + 1) << 16 for item of a tuple (and
   * | 1 << 48: or of a list) */
  int64_t index = a[0] & 0xffff, item = ((a[0] >> 16) & 0xffffffff) - 1, lists = (a[0] >> 48) & 1;
  if (index >= nargs) return 1;
  PyObject *obj = args[index];
  if (item >= 0) {
    if (PyTuple_Check(obj) && PyTuple_Size(obj) > item) obj = PyTuple_GetItem(obj, item);
    else if (lists && PyList_Check(obj) && PyList_Size(obj) > item) obj = PyList_GetItem(obj, item); /* (borrowed) */
    else return 1; /* other sequences: the Python path */
  }
  PyTypeObject *type = Py_TYPE(obj);
  if (type != (PyTypeObject *)p->tensor_type && type != (PyTypeObject *)p->param_type)
    return 1; /* None, other subclasses (fake, functional, distributed tensors) */
  DLTensor *t = &c->dl[a[1]];
  if (p->api->view_of_py(obj, t)) return 1; /* e.g. requires_grad, conjugate views */
  t->data = (char *)t->data + t->byte_offset;
  t->byte_offset = 0;
  int device_ok = t->device.device_type == kDLCUDA || (c->trace && t->device.device_type == kDLCPU);
  if (!device_ok || (c->device >= 0 && t->device.device_id != c->device)) return 1;
  c->device = t->device.device_id;
  if (!c->like) c->like = obj;
  if (t->dtype.code != a[2] || t->dtype.bits != a[3] || t->dtype.lanes != a[4] || t->ndim != a[5]) return 1;
  if (a[6] > 1 && (uintptr_t)t->data % (uintptr_t)a[6]) return 1;
  c->obj[a[1]] = obj;
  return 0;
}

/* The template of slot s for this call's shape (AllocTemplate), made on the second call in a row
 * with that shape, or NULL (borrowed). */
static PyObject *alloc_template(Plan *p, Call *c, const int64_t *a, PyObject *kwargs) {
  int64_t s = a[0], ndim = a[2];
  AllocTemplate *t = &p->templates[s];
  int same = t->device == c->device && t->dtype == a[1] && t->ndim == ndim;
  for (int64_t d = 0; d < ndim; ++d) {
    int64_t size = c->reg[a[3 + d]];
    if (size <= 0) return NULL; /* empty outputs: new_empty (expand would give stride-0 strides) */
    same = same && t->shape[d] == size;
  }
  if (same && t->expanded) return t->expanded;
  Py_CLEAR(t->expanded);
  if (!same) { /* a new shape: remember it; a template only if it comes again */
    t->device = c->device, t->dtype = a[1], t->ndim = ndim;
    for (int64_t d = 0; d < ndim; ++d) t->shape[d] = c->reg[a[3 + d]];
    return NULL;
  }
  PyObject *ones = PyTuple_New(ndim), *sizes = PyTuple_New(ndim);
  for (int64_t d = 0; ones && sizes && d < ndim; ++d) {
    PyTuple_SetItem(ones, d, PyLong_FromLong(1));
    PyTuple_SetItem(sizes, d, PyLong_FromLongLong(t->shape[d]));
  }
  PyObject *method = ones && sizes ? PyObject_GetAttrString(c->like, "new_empty") : NULL;
  PyObject *args = method ? PyTuple_Pack(1, ones) : NULL;
  PyObject *one = args ? PyObject_Call(method, args, kwargs) : NULL;
  t->expanded = one ? PyObject_CallMethod(one, "expand", "(O)", sizes) : NULL;
  Py_XDECREF(one), Py_XDECREF(args), Py_XDECREF(method), Py_XDECREF(sizes), Py_XDECREF(ones);
  if (!t->expanded) PyErr_Clear(), t->device = -1; /* new_empty then, and raises if it must */
  return t->expanded;
}

static int contiguous(const DLTensor *t) {
  int64_t expected = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expected) return 0;
    expected *= t->shape[d];
  }
  return 1;
}

static int allocate(Plan *p, Call *c, const int64_t *a) {
  /* a: S dtype ndim R[ndim]. A new contiguous tensor on the call's device: torch.empty_like of the
   * slot's template, or like.new_empty(shape, dtype=...) with like the call's first tensor: torch's
   * own allocation either way (its caching allocator's block, so record_stream, memory stats and
   * graph pools behave as for any torch tensor). */
  int64_t s = a[0], ndim = a[2];
  PyObject *kwargs = PyTuple_GetItem(p->alloc_kwargs, a[1]);
  if (!c->like || !kwargs || s < 0 || s >= MAX_SLOTS || ndim > MAX_DIMS) return bad_plan();
  PyObject *tmpl = alloc_template(p, c, a, kwargs);
  PyObject *t = tmpl ? PyObject_CallFunctionObjArgs(p->empty_like, tmpl, NULL) : NULL;
  if (t && (p->api->view_of_py(t, &c->dl[s]) || !contiguous(&c->dl[s]))) { /* (never seen: a safeguard) */
    Py_CLEAR(t);
    Py_CLEAR(p->templates[s].expanded);
    p->templates[s].device = -1;
  }
  if (!t) {
    PyErr_Clear();
    PyObject *shape = PyTuple_New(ndim);
    for (int64_t d = 0; shape && d < ndim; ++d) {
      int64_t size = c->reg[a[3 + d]];
      if (size < 0) return Py_DECREF(shape), 1;
      PyTuple_SetItem(shape, d, PyLong_FromLongLong(size));
    }
    PyObject *method = shape ? PyObject_GetAttrString(c->like, "new_empty") : NULL;
    PyObject *args = method ? PyTuple_Pack(1, shape) : NULL;
    t = args ? PyObject_Call(method, args, kwargs) : NULL;
    Py_XDECREF(args);
    Py_XDECREF(method);
    Py_XDECREF(shape);
    if (!t) return 1; /* e.g. out of memory: the Python path allocates again and raises torch's error */
    if (p->api->view_of_py(t, &c->dl[s])) return Py_DECREF(t), 1;
  }
  c->obj[s] = t;
  c->owned[s] = 1;
  return 0;
}

static int view(Call *c, const int64_t *a) {
  /* a: S ndim R[ndim] R[ndim] */
  int64_t s = a[0], ndim = a[1];
  PyObject *sizes = PyTuple_New(ndim), *strides = PyTuple_New(ndim);
  for (int64_t d = 0; sizes && strides && d < ndim; ++d) {
    PyTuple_SetItem(sizes, d, PyLong_FromLongLong(c->reg[a[2 + d]]));
    PyTuple_SetItem(strides, d, PyLong_FromLongLong(c->reg[a[2 + ndim + d]]));
  }
  PyObject *v = sizes && strides ? PyObject_CallMethod(c->obj[s], "as_strided", "(OO)", sizes, strides) : NULL;
  Py_XDECREF(sizes);
  Py_XDECREF(strides);
  if (!v) return -1;
  if (c->owned[s]) Py_DECREF(c->obj[s]);
  c->obj[s] = v;
  c->owned[s] = 1;
  for (int64_t d = 0; d < ndim; ++d) c->shape[s][d] = c->reg[a[2 + d]], c->strides[s][d] = c->reg[a[2 + ndim + d]];
  c->dl[s].ndim = (int32_t)ndim;
  c->dl[s].shape = c->shape[s];
  c->dl[s].strides = c->strides[s];
  return 0;
}

static int stream_of(Plan *p, Call *c) {
  if (c->stream || c->trace) return 0;
  if (p->api->current_stream(kDLCUDA, c->device, &c->stream)) return -1;
  return 0;
}

static int launch(Plan *p, Call *c, const int64_t *a, int64_t n) {
  /* a: kernel n (kind R)[n] R[3] block[3] smem */
  union {
    void *p;
    int32_t i;
    int64_t l;
    float f;
  } value[MAX_PARAMS];
  void *params[MAX_PARAMS];
  if (n > MAX_PARAMS) return bad_plan();
  for (int64_t i = 0; i < n; ++i) {
    int64_t kind = a[2 + 2 * i], r = a[3 + 2 * i];
    if (kind == 'f') value[i].f = p->floats[r];
    else if (!reg_ok(r)) return bad_plan();
    else if (kind == 'p') value[i].p = (void *)(uintptr_t)c->reg[r];
    else if (kind == 'l') value[i].l = c->reg[r];
    else if (kind == 'i') {
      if (c->reg[r] < INT32_MIN || c->reg[r] > INT32_MAX) return 1; /* the Python path raises */
      value[i].i = (int32_t)c->reg[r];
    } else return bad_plan();
    params[i] = &value[i];
  }
  const int64_t *g = a + 2 + 2 * n;
  unsigned dims[6];
  for (int d = 0; d < 6; ++d) {
    int64_t v = d < 3 ? (reg_ok(g[d]) ? c->reg[g[d]] : -1) : g[d];
    if (v < 0 || v > 0x7fffffffL) return 1;
    dims[d] = (unsigned)v;
  }
  unsigned smem = (unsigned)g[6];
  if (c->trace) {
    PyObject *vals = PyTuple_New(n);
    for (int64_t i = 0; vals && i < n; ++i) {
      int64_t kind = a[2 + 2 * i];
      PyTuple_SetItem(vals, i, kind == 'f' ? PyFloat_FromDouble(value[i].f)
                               : kind == 'i' ? PyLong_FromLong(value[i].i) : PyLong_FromLongLong(c->reg[a[3 + 2 * i]]));
    }
    PyObject *entry = vals ? Py_BuildValue("(L(III)(III)IN)", (long long)a[0], dims[0], dims[1], dims[2], dims[3],
                                           dims[4], dims[5], smem, vals) : NULL;
    if (!entry) return -1;
    int rc = PyList_Append(c->trace, entry);
    Py_DECREF(entry);
    return rc;
  }
  if (dims[0] == 0 || dims[1] == 0 || dims[2] == 0) return 0; /* empty problem */
  Loaded *k = plan_handle(p, a[0], c->device);
  if (!k) return PyErr_Occurred() ? -1 : 1;
  if (stream_of(p, c)) return -1;
  return launch_loaded(k, dims, smem, (CUstream)c->stream, params);
}

/* 0: next instruction; 1: NotImplemented; -1: error (set); 2: *result set. */
int plan_step(Plan *p, Call *c, PyObject *const *args, Py_ssize_t nargs, int64_t *pc, PyObject **result) {
  const int64_t *code = p->code;
  int64_t op = code[(*pc)++], r, n, v;
  switch (op) {
    case OP_TENSOR:
      NEED(7);
      if (ARG(0) < 0 || !slot_ok(ARG(1)) || ARG(5) > MAX_DIMS) return bad_plan();
      if (read_tensor(p, c, args, nargs, &ARG(0))) return 1;
      *pc += 7;
      return 0;
    case OP_SHAPE:
    case OP_STRIDE:
      NEED(3);
      if (!slot_ok(ARG(0)) || !c->obj[ARG(0)] || ARG(1) < 0 || ARG(1) >= c->dl[ARG(0)].ndim || !reg_ok(ARG(2)))
        return bad_plan();
      c->reg[ARG(2)] = op == OP_SHAPE ? c->dl[ARG(0)].shape[ARG(1)] : c->dl[ARG(0)].strides[ARG(1)];
      *pc += 3;
      return 0;
    case OP_PTR:
      NEED(2);
      if (!slot_ok(ARG(0)) || !c->obj[ARG(0)] || !reg_ok(ARG(1))) return bad_plan();
      c->reg[ARG(1)] = (int64_t)(uintptr_t)c->dl[ARG(0)].data;
      *pc += 2;
      return 0;
    case OP_EXPR:
    case OP_CHECK:
      NEED(op == OP_EXPR ? 2 : 1);
      r = op == OP_EXPR ? code[(*pc)++] : 0;
      n = ARG(0);
      NEED(1 + n);
      if (!reg_ok(r)) return bad_plan();
      if (plan_eval(&ARG(1), n, c->reg, &v)) return 1; /* e.g. a division by zero: the Python path decides */
      *pc += 1 + n;
      if (op == OP_EXPR) c->reg[r] = v;
      return op == OP_CHECK && !v ? 1 : 0;
    case OP_ALLOC:
      NEED(3);
      n = ARG(2);
      NEED(3 + n);
      if (!slot_ok(ARG(0)) || c->obj[ARG(0)] || n > MAX_DIMS) return bad_plan();
      for (int64_t d = 0; d < n; ++d)
        if (!reg_ok(ARG(3 + d))) return bad_plan();
      if ((v = allocate(p, c, &ARG(0)))) return v;
      *pc += 3 + n;
      return 0;
    case OP_VIEW:
      NEED(2);
      n = ARG(1);
      NEED(2 + 2 * n);
      if (!slot_ok(ARG(0)) || !c->obj[ARG(0)] || n > MAX_DIMS) return bad_plan();
      for (int64_t d = 0; d < 2 * n; ++d)
        if (!reg_ok(ARG(2 + d))) return bad_plan();
      if (view(c, &ARG(0))) return -1;
      *pc += 2 + 2 * n;
      return 0;
    case OP_DISJOINT: {
      NEED(2);
      if (!slot_ok(ARG(0)) || !slot_ok(ARG(1)) || !c->obj[ARG(0)] || !c->obj[ARG(1)]) return bad_plan();
      uintptr_t alo, ahi, blo, bhi;
      extent(&c->dl[ARG(0)], &alo, &ahi);
      extent(&c->dl[ARG(1)], &blo, &bhi);
      *pc += 2;
      return alo < ahi && blo < bhi && alo < bhi && blo < ahi ? 1 : 0;
    }
    case OP_DISJOINT_SET: {
      NEED(2);
      int64_t ni = ARG(0), no = ARG(1);
      if (ni < 0 || no < 0 || ni + no > MAX_SLOTS) return bad_plan();
      NEED(2 + ni + no);
      uintptr_t lo[MAX_SLOTS], hi[MAX_SLOTS];
      for (int64_t k = 0; k < ni + no; ++k) {
        if (!slot_ok(ARG(2 + k)) || !c->obj[ARG(2 + k)]) return bad_plan();
        extent(&c->dl[ARG(2 + k)], &lo[k], &hi[k]);
      }
      *pc += 2 + ni + no;
      for (int64_t o = ni; o < ni + no; ++o) /* each output against the inputs and the outputs before it */
        for (int64_t k = 0; k < o; ++k)
          if (lo[o] < hi[o] && lo[k] < hi[k] && lo[o] < hi[k] && lo[k] < hi[o]) return 1;
      return 0;
    }
    case OP_ZERO: {
      NEED(2);
      if (!slot_ok(ARG(0)) || !c->obj[ARG(0)] || !reg_ok(ARG(1))) return bad_plan();
      void *data = c->dl[ARG(0)].data;
      v = c->reg[ARG(1)];
      *pc += 2;
      if (c->trace || v <= 0) return 0;
      if (stream_of(p, c)) return -1;
      CUresult rc = cu.MemsetD8Async((CUdeviceptr)(uintptr_t)data, 0, (size_t)v, (CUstream)c->stream);
      return rc == CUDA_SUCCESS ? 0 : raise_cu(rc, "cuMemsetD8Async");
    }
    case OP_LAUNCH:
      NEED(2);
      n = ARG(1);
      NEED(2 + 2 * n + 7);
      if ((v = launch(p, c, &ARG(0), n))) return v;
      *pc += 2 + 2 * n + 7;
      return 0;
    case OP_BUMP: {
      NEED(1);
      n = ARG(0);
      if (n < 1 || n > MAX_SLOTS) return bad_plan();
      NEED(1 + n);
      for (int64_t k = 0; k < n; ++k)
        if (!slot_ok(ARG(1 + k)) || !c->obj[ARG(1 + k)]) return bad_plan();
      if (!c->trace) { /* one call for all: torch's version bump takes a tuple */
        PyObject *written = PyTuple_New(n);
        for (int64_t k = 0; written && k < n; ++k) {
          Py_INCREF(c->obj[ARG(1 + k)]);
          PyTuple_SetItem(written, k, c->obj[ARG(1 + k)]);
        }
        PyObject *none = written ? PyObject_CallFunctionObjArgs(p->bump, written, NULL) : NULL;
        Py_XDECREF(written);
        if (!none) return -1;
        Py_DECREF(none);
      }
      *pc += 1 + n;
      return 0;
    }
    case OP_RETURN: {
      NEED(1);
      n = ARG(0);
      NEED(1 + n);
      int64_t pos = 0;
      *result = plan_return(c, &ARG(1), n, &pos);
      *pc += 1 + n;
      return *result ? 2 : -1;
    }
    default:
      return bad_plan();
  }
}
