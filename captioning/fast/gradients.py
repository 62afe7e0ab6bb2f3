"""The gradients of what the fast path's loops read at every step, made once per pass.

Nothing here changes a number (up to the order of float additions); the tests compare each with
plain autograd. Reason: plain autograd makes, at every step's backward, a gradient of the whole
weight (or tensor) from the few rows that step used, and adds it to a running sum, so the
backward pass's cost grows with steps x weight size rather than with the rows used.

A linear layer applied at every step, with ONE weight-gradient product: at step t the decoder
multiplies a few rows x_t (the captions still running) by a weight W (out, in).
:class:`DeferredLinear` keeps, at each step's backward, only the rows (dL/dy_t, x_t), and when
backward reaches W (after every step, since every step reads it) makes its gradient at once:

    dL/dW = sum_t (dL/dy_t)^T x_t = [dL/dy_1; ...; dL/dy_T]^T [x_1; ...; x_T],   dL/db = sum of the rows.

The numbers are those of plain autograd (up to the order of the float additions).

    layer = DeferredLinear(weight, bias)   # once per forward pass
    for t in ...:
        y = layer(x_t)                      # as F.linear(x_t, weight, bias)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class _Rows:
    """The (dL/dy_t, x_t) pairs of one layer's steps, waiting for the weight's backward."""

    def __init__(self):
        self.grads: list[Tensor] = []
        self.inputs: list[Tensor] = []


class _Tap(torch.autograd.Function):
    """Identity on the parameters; its backward makes their gradients from the collected rows."""

    @staticmethod
    def forward(ctx, rows: _Rows, weight: Tensor, *bias: Tensor):
        ctx.rows = rows
        ctx.dtypes = (weight.dtype,) + tuple(b.dtype for b in bias)
        ctx.set_materialize_grads(False)  # the steps pass no gradient here; nothing to allocate
        return (weight.view_as(weight),) + tuple(b.view_as(b) for b in bias)

    @staticmethod
    def backward(ctx, *unused):
        rows = ctx.rows
        if not rows.grads:
            return (None,) * (1 + len(ctx.dtypes))
        g = torch.cat(rows.grads).to(ctx.dtypes[0])  # (N, out): every step's rows
        x = torch.cat(rows.inputs).to(ctx.dtypes[0])  # (N, in)
        rows.grads.clear()
        rows.inputs.clear()
        grad_weight = g.t() @ x  # (out, in): one product for all steps
        grad_bias = (g.sum(0).to(ctx.dtypes[1]),) if len(ctx.dtypes) > 1 else ()
        return (None, grad_weight) + grad_bias


class _StepLinear(torch.autograd.Function):
    """y = x W^T + b; backward gives x its gradient and leaves the rows for :class:`_Tap`."""

    @staticmethod
    def forward(ctx, x: Tensor, rows: _Rows, weight: Tensor, *bias: Tensor):
        device = x.device.type
        if torch.is_autocast_enabled(device):  # compute as autocast would (bf16 on the matmul)
            dtype = torch.get_autocast_dtype(device)
            x, weight, bias = x.to(dtype), weight.to(dtype), tuple(b.to(dtype) for b in bias)
        with torch.autocast(device, enabled=False):
            y = F.linear(x, weight, bias[0] if bias else None)
        ctx.save_for_backward(x, weight)
        ctx.rows, ctx.has_bias = rows, bool(bias)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        ctx.rows.grads.append(grad)
        ctx.rows.inputs.append(x)
        return (grad @ weight, None, None) + ((None,) if ctx.has_bias else ())


class DeferredLinear:
    """``F.linear(x, weight, bias)`` for the steps of one forward pass, its weight gradient made in one product."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None):
        self.rows = _Rows()
        self.params = _Tap.apply(self.rows, weight, *(() if bias is None else (bias,)))

    @torch.compiler.disable  # inside a compiled step (compile_step) this runs eagerly
    def __call__(self, x: Tensor) -> Tensor:
        return _StepLinear.apply(x, self.rows, *self.params)


class Linear:
    """``F.linear(x, weight, bias)`` (the products the loops repeat when no gradient is made)."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None):
        self.weight, self.bias = weight, bias

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


def deferred_linear(weight: Tensor, bias: Tensor | None = None) -> Linear | DeferredLinear:
    """A :class:`DeferredLinear` when ``weight`` will get a gradient, else a plain product."""
    if torch.is_grad_enabled() and weight.requires_grad:
        return DeferredLinear(weight, bias)
    return Linear(weight, bias)


class _Sum:
    """The gradient of a tensor read by many steps, summed in place as their backward passes come."""

    def __init__(self):
        self.grad: Tensor | None = None


class _SumTap(torch.autograd.Function):
    """Identity; its backward hands on the summed gradient of every step's rows (and any other use's)."""

    @staticmethod
    def forward(ctx, total: _Sum, x: Tensor):
        ctx.total = total
        ctx.set_materialize_grads(False)  # the steps pass no gradient here; nothing to allocate
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor | None):
        summed, ctx.total.grad = ctx.total.grad, None
        if grad is not None:
            summed = grad if summed is None else summed + grad
        return None, summed


class _FirstRows(torch.autograd.Function):
    """x[:n]; backward adds the rows' gradient into the shared sum's first n rows."""

    @staticmethod
    def forward(ctx, x: Tensor, total: _Sum, n: int):
        ctx.total, ctx.n, ctx.shape = total, n, x.shape
        return x[:n]

    @staticmethod
    def backward(ctx, grad: Tensor):
        total = ctx.total
        if total.grad is None:
            total.grad = grad.new_zeros(ctx.shape)
        total.grad[: ctx.n] += grad
        return None, None, None


class FirstRows:
    """The first n rows of a tensor (B, ...), for a loop whose step t reads rows [:n_t] (the
    shrinking batch's features and W_a a in the fast path's packed pass), with ONE gradient buffer.

    Plain slicing gives every step's backward a zero tensor of the whole (B, ...) shape with the
    rows' gradient copied in, and adds it to the running sum: three passes over the whole tensor per
    step. Here each step's backward adds its rows into one buffer, in place, and the tensor gets the
    buffer once, after every step. The numbers are those of plain autograd (up to the order of the
    float additions).

        rows = FirstRows(features)     # once per forward pass
        for t, n in ...:
            f_t = rows(n)              # as features[:n]
    """

    def __init__(self, x: Tensor):
        self.total = _Sum()
        self.grad = torch.is_grad_enabled() and x.requires_grad
        self.x = _SumTap.apply(self.total, x) if self.grad else x

    @torch.compiler.disable  # inside a compiled step this runs eagerly
    def __call__(self, n: int) -> Tensor:
        return _FirstRows.apply(self.x, self.total, n) if self.grad else self.x[:n]
