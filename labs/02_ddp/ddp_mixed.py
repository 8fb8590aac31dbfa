"""The lecture's 16-byte mixed-precision recipe on this lab's DDP: :class:`MasterAdamW`.

DDP itself does not change: wrap a model whose parameters are bf16 (``model.to(bfloat16)``),
and every bucket, gradient and all-reduce is bf16, because :class:`ddp.DDP` allocates its
buckets in the parameters' dtype and ``param.grad`` is a view of its bucket. What the recipe
adds is the optimizer: :class:`MasterAdamW` keeps an fp32 *master* copy of every parameter and
AdamW's two moments (fp32 for ``mixed-adam-16``, bf16 for ``low-precision-12``), computes the
update in fp32 from the bf16 gradient, and rounds the master into the bf16 parameter.

Per rank nothing is sharded (DDP), so the model state is
:func:`shardlab.accounting.memory.model_state` ``(N, D, "ddp", recipe)`` exactly:
weights 2N (bf16 parameters), grads 2N (the bf16 buckets), master 4N, moments 4N + 4N
(16 bytes) or 2N + 2N (12 bytes).

Gradient path: bf16 gradients, divided by D and all-reduced in bf16 (q = 2 bytes per element,
half the fp32 volume of :func:`shardlab.accounting.comm.step_volume` ``("ddp", N, D, 2)``).
On 2 ranks the sum of two bf16 numbers is rounded once and the pre-division by 2 is exact,
so the result equals one process accumulating two half-batch gradients in bf16, bit for bit.
The 10-byte recipe (fp32 gradients with bf16 weights) needs gradient storage whose dtype
differs from the parameter's; ``param.grad`` cannot be that, so it lives in lab 03's
``mixed_precision.py`` (a flat ``main_grad``), which runs all three recipes on all layouts.

Production: PyTorch has no master-weight optimizer; FSDP2's ``MixedPrecisionPolicy`` keeps
fp32 sharded parameters as the master and casts to bf16 for compute, DeepSpeed's bf16
optimizer and Megatron's ``Float16OptimizerWithFloat16Params`` do what this class does.
"""

from __future__ import annotations

import torch

_MOMENT_DTYPES = (torch.float32, torch.bfloat16)


class MasterAdamW(torch.optim.Optimizer):
    """AdamW on fp32 master copies of low-precision ``params``; moments in ``moment_dtype``.

    ``masters``: the fp32 values to start from, one per parameter (the model's values before
    it was cast to bf16); default: the parameters themselves upcast.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.1,
        moment_dtype: torch.dtype = torch.float32,
        masters: list[torch.Tensor] | None = None,
    ) -> None:
        if not lr > 0 or not eps > 0 or not weight_decay >= 0:
            raise ValueError(
                f"lr={lr!r}, eps={eps!r} must be > 0 and weight_decay={weight_decay!r} >= 0"
            )
        if moment_dtype not in _MOMENT_DTYPES:
            raise ValueError(f"moment_dtype={moment_dtype!r} is not one of {_MOMENT_DTYPES}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.moment_dtype = moment_dtype
        ps = [p for g in self.param_groups for p in g["params"]]
        if masters is not None and [m.shape for m in masters] != [p.shape for p in ps]:
            raise ValueError(
                f"masters has {len(masters)} tensors of shapes {[tuple(m.shape) for m in masters]}"
                f" but the parameters are {[tuple(p.shape) for p in ps]}"
            )
        for i, p in enumerate(ps):
            src = p.detach() if masters is None else masters[i].detach()
            # BEGIN SOLUTION hint: state[p]: "master" = fp32 copy of src, "exp_avg"/"exp_avg_sq" = zeros in moment_dtype, "step" = 0
            self.state[p] = {
                "master": src.to(torch.float32, copy=True),
                "exp_avg": torch.zeros(p.shape, dtype=moment_dtype, device=p.device),
                "exp_avg_sq": torch.zeros(p.shape, dtype=moment_dtype, device=p.device),
                "step": 0,
            }
            # END SOLUTION

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                # BEGIN SOLUTION hint: torch.optim.AdamW's update in fp32: g = p.grad upcast; m.lerp_(g, 1-b1); v.mul_(b2).addcmul_(g, g, 1-b2) (store back in moment dtype); master *= 1-lr*wd; master.addcdiv_(m, sqrt(v)/sqrt(bc2)+eps, -lr/bc1); p.copy_(master)
                st["step"] += 1
                t = st["step"]
                g = p.grad.float()
                m, v = st["exp_avg"].float(), st["exp_avg_sq"].float()  # same tensor in fp32
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                st["exp_avg"].copy_(m)  # rounds to bf16 in the 12-byte recipe
                st["exp_avg_sq"].copy_(v)
                master = st["master"]
                master.mul_(1 - lr * wd)
                denom = (v.sqrt() / (1 - b2**t) ** 0.5).add_(eps)
                master.addcdiv_(m, denom, value=-lr / (1 - b1**t))
                p.copy_(master)  # round to nearest bf16: the compute copy
                # END SOLUTION
        return loss
