"""Call plans: an op's whole CUDA call (checks, output allocation, argument packing, launches)
compiled once per call key into a program that the native launcher runs (native_call.c).

An op builds a plan the first time it sees a key (its dtypes and non-tensor arguments, which
the Python path has validated by then), and later calls cost a dict lookup and one native call:

    b = Builder()
    x = b.tensor(0, torch.bfloat16, ("T", "H"), strides=("xs", 1), align=16)
    b.check("H % 16 == 0")
    y = b.alloc(torch.float8_e4m3fn, ("T", "H"))
    b.launch(kernel, X=x, Y=y, num_tokens="T", hidden="H", x_stride="xs", eps=1e-6)
    b.returns(y)
    plan = b.build()
    result = run(plan, x_tensor)   # NotImplemented: take the Python path

Tensors are exactly torch.Tensor or torch.nn.Parameter (other subclasses take the Python path).
Shapes and strides name symbols: the first use binds one, later uses check it; an int or an
expression is checked. Expressions are integer arithmetic (+ - * // % min max), comparisons,
and/or/not over symbols. A plan accepts exactly the tensors it describes (exact torch.Tensor
type, dtype, rank, device CUDA, alignment); anything else makes run() return NotImplemented, so
the Python path, with its typed errors, stays the one definition of what an op accepts.
Plans need torch's DLPack C exchange API (1.3, torch >= 2.11): `available()`.
"""

from __future__ import annotations

import ast
import functools
import struct

import torch

# native_call.h's opcodes, expression tokens and return-template codes.
(OP_TENSOR, OP_SHAPE, OP_STRIDE, OP_PTR, OP_EXPR, OP_CHECK, OP_ALLOC, OP_VIEW, OP_DISJOINT, OP_ZERO, OP_LAUNCH,
 OP_BUMP, OP_RETURN, OP_DISJOINT_SET) = range(1, 15)  # fmt: skip
T_REG, T_CONST, T_ADD, T_SUB, T_MUL, T_FLOORDIV, T_MOD, T_MIN, T_MAX, T_EQ, T_NE, T_LT, T_LE, T_AND, T_OR, T_NOT = range(16)
RET_SLOT, RET_TUPLE, RET_NONE = range(3)
MAX_REGS, MAX_SLOTS = 640, 72

_BINOPS = {ast.Add: T_ADD, ast.Sub: T_SUB, ast.Mult: T_MUL, ast.FloorDiv: T_FLOORDIV, ast.Mod: T_MOD}
_COMPARE = {ast.Eq: (T_EQ, False), ast.NotEq: (T_NE, False), ast.Lt: (T_LT, False), ast.LtE: (T_LE, False),
            ast.Gt: (T_LT, True), ast.GtE: (T_LE, True)}  # fmt: skip

# DLPack dtype (code, bits, lanes) of the torch dtypes the kernels take (dlpack.h's DLDataTypeCode).
_DL_DTYPES = {
    torch.bool: (6, 8, 1), torch.uint8: (1, 8, 1), torch.int8: (0, 8, 1), torch.int16: (0, 16, 1),
    torch.int32: (0, 32, 1), torch.int64: (0, 64, 1), torch.float16: (2, 16, 1), torch.bfloat16: (4, 16, 1),
    torch.float32: (2, 32, 1), torch.float64: (2, 64, 1), torch.float8_e4m3fn: (10, 8, 1),
    torch.float8_e5m2: (12, 8, 1),
}  # fmt: skip


@functools.cache
def available() -> bool:
    """Whether this torch exposes the DLPack C exchange API the plans need (1.3)."""
    from tilebake._runtime.loader import _native

    try:
        _native().plan(
            b"", (), (), torch.autograd.graph.increment_version, torch.Tensor, torch.nn.Parameter, (), torch.empty_like
        )
    except (AttributeError, RuntimeError, ValueError):
        return False
    return True


@functools.cache
def _bump_tuple():
    """The function a plan calls with the tuple of tensors it wrote in place: torch's own C
    function where it takes a tuple (0.3 us against 0.6 a tensor through the public wrapper),
    else the public wrapper a tensor at a time."""
    with torch.inference_mode(False):  # (a plan first built in inference mode: its tensors have no version)
        probe = torch.empty(0)
        before = probe._version
        try:
            torch._C._increment_version((probe,))
        except (AttributeError, TypeError, RuntimeError):
            pass
        if probe._version == before + 1:
            return torch._C._increment_version
    return lambda written: [torch.autograd.graph.increment_version(t) for t in written] and None


class Ref:
    """A tensor slot of a plan: an argument or an allocated output."""

    def __init__(self, slot: int, dtype: torch.dtype, ndim: int):
        self.slot, self.dtype, self.ndim = slot, dtype, ndim


class Builder:
    def __init__(self):
        self.code: list[int] = []
        self.floats: list[float] = []
        self.kernels: list = []  # (kernel, its launch spec)
        self.dtypes: list[torch.dtype] = []  # of the allocated outputs
        self.regs: dict[str, int] = {}  # symbol -> register (several symbols may name one: let())
        self.nregs = 0
        self.slots = 0
        self.launched = False
        self.bumps: list[int] = []  # slots written in place: bumped together before the return

    # --- registers and expressions ---
    def _reg(self, name: str | None = None) -> int:
        if self.nregs >= MAX_REGS:
            raise ValueError("call plan: too many registers")
        reg, self.nregs = self.nregs, self.nregs + 1
        self.regs[name or f"%{reg}"] = reg
        return reg

    def _tokens(self, node) -> list[int]:
        if isinstance(node, ast.Expression):
            return self._tokens(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, bool):
            return [T_CONST | int(node.value) << 8]
        if isinstance(node, ast.Name):
            if node.id not in self.regs:
                raise ValueError(f"call plan: unknown symbol {node.id!r}")
            return [T_REG | self.regs[node.id] << 8]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return self._tokens(node.left) + self._tokens(node.right) + [_BINOPS[type(node.op)]]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return [T_CONST] + self._tokens(node.operand) + [T_SUB]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return self._tokens(node.operand) + [T_NOT]
        if isinstance(node, ast.BoolOp):
            op = T_AND if isinstance(node.op, ast.And) else T_OR
            out = self._tokens(node.values[0])
            for value in node.values[1:]:
                out += self._tokens(value) + [op]
            return out
        if isinstance(node, ast.Compare):
            out, left = [], node.left
            for i, (op, right) in enumerate(zip(node.ops, node.comparators)):
                code, swap = _COMPARE[type(op)]
                a, b = (right, left) if swap else (left, right)
                out += self._tokens(a) + self._tokens(b) + [code] + ([T_AND] if i else [])
                left = right
            return out
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            op = T_MIN if node.func.id == "min" else T_MAX
            out = self._tokens(node.args[0])
            for arg in node.args[1:]:
                out += self._tokens(arg) + [op]
            return out
        raise ValueError(f"call plan: unsupported expression {ast.dump(node)}")

    def value(self, expr) -> int:
        """The register holding an int expression (a symbol's own register for a bare name, one
        register per constant: launches' grids repeat "1")."""
        if isinstance(expr, str) and expr.isidentifier() and expr in self.regs:
            return self.regs[expr]
        const = f"#{int(expr)}" if isinstance(expr, int) or (isinstance(expr, str) and expr.isdigit()) else None
        if const in self.regs:
            return self.regs[const]
        tokens = self._tokens(ast.parse(str(int(expr)) if isinstance(expr, int) else expr, mode="eval"))
        reg = self._reg(const)
        self.code += [OP_EXPR, reg, len(tokens), *tokens]
        return reg

    def let(self, name: str, expr) -> None:
        """Define a symbol as an expression of others."""
        self.regs[name] = self.value(expr)

    def check(self, expr: str) -> None:
        """The call takes the plan only where expr holds (else: the Python path)."""
        tokens = self._tokens(ast.parse(expr, mode="eval"))
        self.code += [OP_CHECK, len(tokens), *tokens]

    def _bind(self, op: int, ref: Ref, dim: int, spec) -> None:
        if spec is None:
            return
        if isinstance(spec, str) and spec.isidentifier() and spec not in self.regs:
            self.code += [op, ref.slot, dim, self._reg(spec)]
            return
        reg = self._reg()
        self.code += [op, ref.slot, dim, reg]
        tokens = [T_REG | reg << 8] + self._tokens(ast.parse(str(spec), mode="eval")) + [T_EQ]
        self.code += [OP_CHECK, len(tokens), *tokens]

    # --- tensors ---
    def _slot(self, dtype, ndim) -> Ref:
        if self.slots == MAX_SLOTS:
            raise ValueError("call plan: too many tensors")
        self.slots += 1
        return Ref(self.slots - 1, dtype, ndim)

    def tensor(self, arg, dtype: torch.dtype, shape, strides=None, align: int = 16, lists: bool = False) -> Ref:
        """Argument `arg` of run() (or (arg, i): item i of that argument, a tuple, or a list too where
        `lists`: an op whose Python path takes either): a CUDA tensor
        (exactly torch.Tensor) of this dtype and shape, its data `align`-byte aligned; strides:
        per dim a symbol, an int or an expression to check, or None (any)."""
        ref = self._slot(dtype, len(shape))
        index = arg if isinstance(arg, int) else arg[0] | (arg[1] + 1) << 16 | int(lists) << 48
        self.code += [OP_TENSOR, index, ref.slot, *_DL_DTYPES[dtype], len(shape), align]
        for d, spec in enumerate(shape):
            self._bind(OP_SHAPE, ref, d, spec)
        for d, spec in enumerate(strides or ()):
            self._bind(OP_STRIDE, ref, d, spec)
        return ref

    def alloc(self, dtype: torch.dtype, shape, view=None) -> Ref:
        """A new contiguous tensor of `shape` (expressions) on the call's device (the first
        tensor's new_empty); view: (sizes, strides) of an as_strided view of it to use instead
        (e.g. column-major)."""
        if self.launched:
            raise ValueError("call plan: allocate before the first launch (a failed allocation falls back)")
        regs = [self.value(s) for s in shape]
        ref = self._slot(dtype, len(shape))
        if dtype not in self.dtypes:
            self.dtypes.append(dtype)
        self.code += [OP_ALLOC, ref.slot, self.dtypes.index(dtype), len(shape), *regs]
        if view is not None:
            sizes, strides = ([self.value(e) for e in part] for part in view)
            self.code += [OP_VIEW, ref.slot, len(sizes), *sizes, *strides]
            ref.ndim = len(sizes)
        return ref

    def address(self, ref: Ref, name: str) -> None:
        """Bind symbol `name` to ref's data address (bytes): pointers into one allocation
        (`name + offset` as a pointer parameter)."""
        self.code += [OP_PTR, ref.slot, self._reg(name)]

    def disjoint(self, a: Ref, b: Ref) -> None:
        self.code += [OP_DISJOINT, a.slot, b.slot]

    def disjoint_set(self, inputs: list, outputs: list) -> None:
        """No output's memory overlaps an input's or another output's (one pass over their extents)."""
        self.code += [OP_DISJOINT_SET, len(inputs), len(outputs), *(r.slot for r in (*inputs, *outputs))]

    def zero(self, ref: Ref, nbytes) -> None:
        self.code += [OP_ZERO, ref.slot, self.value(nbytes)]

    def bump(self, ref: Ref) -> None:
        """Count a write into an argument, as torch's in-place and out= ops do (after the
        launches: one call for all the plan's, emitted by returns())."""
        self.bumps.append(ref.slot)

    # --- launches and the result ---
    def launch(self, kernel, device: int, **params) -> None:
        """Launch `kernel` (a loader.Kernel) with its declared parameters: a Ref (its data
        pointer), None (a null pointer), an int expression, or a float."""
        names, kinds, grid, block, smem = kernel.launch_spec(device)
        missing = set(names) ^ set(params)
        if missing:
            raise ValueError(f"call plan for {kernel.variant.id}: parameters {sorted(missing)} missing or unknown")
        regs = {}
        for name, kind in zip(names, kinds):
            value = params[name]
            if kind == "f":
                self.floats.append(float(value))
                regs[name] = len(self.floats) - 1
            elif isinstance(value, Ref):
                regs[name] = reg = self._reg()
                self.code += [OP_PTR, value.slot, reg]
            else:
                regs[name] = self.value(0 if value is None else value)
        # The grid is an expression of the kernel's parameters (the manifest's): their registers.
        self.regs.update({f"_p_{n}": r for n, r in regs.items() if kinds[names.index(n)] != "f"})
        grid_regs = [self.value(ast.unparse(_rename(ast.parse(g, mode="eval"), names))) for g in grid]
        self.kernels.append((kernel, (names, kinds, tuple(grid), tuple(block), smem)))
        self.code += [OP_LAUNCH, len(self.kernels) - 1, len(names)]
        for name, kind in zip(names, kinds):
            self.code += [ord(kind), regs[name]]
        self.code += [*grid_regs, *block, smem]
        self.launched = True

    def returns(self, template) -> None:
        tokens: list[int] = []

        def walk(t):
            if t is None:
                tokens.append(RET_NONE)
            elif isinstance(t, Ref):
                tokens.append(RET_SLOT | t.slot << 8)
            else:
                tokens.append(RET_TUPLE | len(t) << 8)
                for item in t:
                    walk(item)

        walk(template)
        if self.bumps:
            self.code += [OP_BUMP, len(self.bumps), *self.bumps]
        self.code += [OP_RETURN, len(tokens), *tokens]

    def build(self):
        from tilebake._runtime.loader import _native

        resolvers = tuple(functools.partial(_resolve, kernel, spec) for kernel, spec in self.kernels)
        code = struct.pack(f"<{len(self.code)}q", *self.code)
        globals()["run"] = _native().run
        alloc_kwargs = tuple({"dtype": dtype} for dtype in self.dtypes)
        return _native().plan(
            code, tuple(self.floats), resolvers, _bump_tuple(), torch.Tensor, torch.nn.Parameter, alloc_kwargs,
            torch.empty_like,
        )  # fmt: skip


def _rename(tree, names):
    """A grid expression's parameter names -> the plan's registers for them."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in names:
            node.id = f"_p_{node.id}"
    return tree


def _resolve(kernel, spec, device: int):
    """The kernel's handle on `device` for a plan built from `spec`, or None (the Python path)
    where that device's binary takes another launch (an arch whose lowering differs)."""
    names, kinds, grid, block, smem = kernel.launch_spec(device)
    if (names, kinds, tuple(grid), tuple(block), smem) != spec:
        return None
    return kernel.handle(device)


_CACHES: list[dict] = []


def cache() -> dict:
    """An op's plans by call key; emptied when a tilebake.config setting they bake in changes."""
    plans: dict = {}
    _CACHES.append(plans)
    return plans


def clear_all() -> None:
    for plans in _CACHES:
        plans.clear()


def build_if_available(make, *args):
    """make(*args), a plan, where torch has the exchange API; None (the Python path) elsewhere."""
    return make(*args) if available() else None


# Plans bake in scalar arguments (eps, scaling factors): a caller varying one per call would build
# a plan per value, so past MAX_PLANS keys a cache takes no new ones (those calls: the Python path).
MAX_PLANS = 64


def remember(plans: dict, key, make, *args) -> None:
    """plans[key] = make(*args), once per key, where torch has the exchange API and the cache has
    room; an unhashable key gets none. What an op's Python path calls after its launches."""
    try:
        if key in plans or len(plans) >= MAX_PLANS:
            return
    except TypeError:
        return
    built = build_if_available(make, *args)
    if built is not None:
        plans[key] = built


def bump(*tensors) -> None:
    """Count a kernel's writes into given tensors (Nones skipped), as torch's in-place and out= ops
    do (a plan's Builder.bump does the same)."""
    torch.autograd.graph.increment_version([t for t in tensors if t is not None])


def run(plan, *args):
    """run(plan, *args): the op's result, or NotImplemented (take the Python path). The native
    function itself once a plan is built (ops call it as `plan.run`: no Python frame between)."""
    from tilebake._runtime.loader import _native

    return _native().run(plan, *args)
