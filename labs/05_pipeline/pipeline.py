"""Pipeline parallelism: the GPT cut into stages, and an executor of the accounting schedules.

What is sharded: the *layers*. ``n_layer`` blocks are cut into ``p v`` contiguous virtual
stages (:func:`split_stages`); rank ``r`` of ``p`` owns virtual stages ``c p + r`` for
``c = 0..v-1`` (``v = 1`` except for the interleaved schedule), with the embeddings on virtual
stage 0 and the final LayerNorm, the LM head and the loss on the last one. The V schedules
(``zbv``, ``dualpipev``, ``v = 2``) place chunk 0 = stage ``r`` and chunk 1 = stage ``2p-1-r``
on rank ``r`` instead (``accounting.pipeline.virtual_stage``): rank 0 holds both ends of the
model, rank ``p-1`` the V's tip, stages ``p-1`` and ``p``. Nothing is replicated: every parameter lives on exactly one rank, with its gradient and optimizer state.

Which communication runs: point-to-point only. Per microbatch, every virtual stage but the last
``isend``\\s its ``(b, s, h)`` output to the rank owning the next one (forward), and every
virtual stage but the first sends the gradient of its input back (backward); the receiving
rank ``irecv``\\s it just before the action that needs it. A message between two chunks of one
rank (the V's tip) is handed over in memory, nothing is sent. Each message is tagged with
(direction, microbatch, virtual stage), so two messages between the same pair of ranks can
never be confused (with interleaving, activations and gradients travel between the same two
ranks in both directions). Bytes per step: ``accounting.pipeline.p2p_sent_bytes``, i.e.
``accounting.comm.pipeline_p2p_volume(b, s, h, q, m, v)`` for an interior rank.

The order: :class:`PipelineExecutor` runs *exactly* the action list
``accounting.pipeline.schedule(kind, p, m, v)[rank]`` -- ``F`` (forward), ``B`` (backward),
and for zero bubble ``BI`` (gradient w.r.t. the stage input only, sent upstream at once) and
``BW`` (weight gradients, deferred). ``BI`` runs autograd without keeping the graph: every
tensor autograd saved is freed on the way down, except what the weight gradients read, each
weight-owning layer's input (kept by the forward hook) and, computed by ``BI``, the gradient
of its output; ``BW`` turns those into ``.grad`` with the kernels autograd itself runs
(:func:`weight_grads`), so the numbers are bitwise autograd's. Between ``BI`` and ``BW`` a
microbatch holds ``accounting.pipeline.inflight_bytes``' ``kept_bytes`` instead of all its
saved activations. On virtual stage 0 no stage waits for an input gradient: its ``BI`` only
keeps the output gradient and ``BW`` runs the whole backward there (as PyTorch's
``stage_backward_input`` does nothing for a stage whose inputs need no gradient), so nothing
is held twice (``kept_bytes`` = all its saved activations). DualPipe-V's overlapped
forward-backward pairs run as the two actions ``F`` then ``B``, without overlap (as PyTorch's
runtime runs them when no overlap callback is registered). Gradients accumulate over the ``m``
microbatches; each microbatch's loss is divided by ``m``, so the sum is the mean over the
global batch.

What PyTorch uses in production: ``torch.distributed.pipelining`` (``PipelineStage`` plus
``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``,
``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``); see
``benchmark_pipeline.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from shardlab.accounting import pipeline as acc
from shardlab.models import GPT
from torch import nn


@dataclass(frozen=True)
class PipeConfig:
    """A schedule ``kind`` (``accounting.pipeline.KINDS``) on ``p`` ranks, ``m`` microbatches,
    ``v`` model chunks per rank (interleaved, or 2 for the V schedules zbv and dualpipev)."""

    kind: str
    p: int
    m: int
    v: int = 1

    def __post_init__(self) -> None:
        # the same validation the schedule generator applies: unknown kind, v > 1 outside
        # interleaved, m % p != 0 for interleaved, non-positive sizes
        acc.check_pipeline(self.kind, self.p, self.m, self.v)


class Stage(nn.Module):
    """Layers ``[lo, hi)`` of a :class:`GPT`: embeddings if ``first``, LayerNorm + head if
    ``last``. ``forward(x)`` maps token ids (first) or the ``(b, s, h)`` residual stream to
    the next stage's input, or to logits ``(b, s, V)`` on the last stage. The modules are
    the model's own (no copy)."""

    def __init__(self, model: GPT, lo: int, hi: int, first: bool, last: bool) -> None:
        super().__init__()
        self.lo, self.hi, self.first, self.last = lo, hi, first, last
        if first:
            self.tok_emb, self.pos_emb, self.drop = model.tok_emb, model.pos_emb, model.drop
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        if last:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the same operations, in the same order, as GPT.forward: bitwise the same numbers
        if self.first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.drop(self.tok_emb(x) + self.pos_emb(pos))  # (b, s, h)
        for blk in self.blocks:
            x = blk(x)  # (b, s, h)
        if self.last:
            x = self.lm_head(self.ln_f(x))  # (b, s, V)
        return x


def split_stages(model: GPT, p: int, v: int = 1, layers: list[int] | None = None) -> list[Stage]:
    """All ``p v`` virtual stages of ``model`` in order (stage ``k`` belongs to rank ``k % p``).

    ``layers``: blocks per virtual stage (default: equal, ``accounting.pipeline.
    stage_bounds``); every stage needs at least one block. Tied embeddings are refused: the
    embedding and the head would be one tensor on two ranks.
    """
    n = model.config.n_layer
    if model.config.tied_embeddings:
        raise ValueError("split_stages: tied_embeddings=True puts one weight on two stages")
    # BEGIN SOLUTION hint: bounds = acc.stage_bounds(n, p, v) (its ValueError names the values), or from layers (check: p*v positive counts summing to n); then one Stage(model, lo, hi, first=k == 0, last=k == len(bounds) - 1) per (lo, hi)
    if layers is None:
        bounds = acc.stage_bounds(n, p, v)  # ValueError names n_layer, p, v
    else:
        layers = list(layers)
        if len(layers) != p * v or sum(layers) != n or min(layers) < 1:
            raise ValueError(
                f"split_stages: layers={layers} must hold p*v = {p}*{v} = {p * v} positive "
                f"counts summing to n_layer={n}"
            )
        ends = [sum(layers[: i + 1]) for i in range(len(layers))]
        bounds = list(zip([0, *ends[:-1]], ends))
    return [
        Stage(model, lo, hi, first=k == 0, last=k == len(bounds) - 1)
        for k, (lo, hi) in enumerate(bounds)
    ]
    # END SOLUTION


def microbatch_loss(logits: torch.Tensor, targets: torch.Tensor, m: int) -> torch.Tensor:
    """Mean cross-entropy of one microbatch divided by ``m`` (fp32): summed over the ``m``
    microbatches this is the mean over the global batch."""
    # BEGIN SOLUTION hint: F.cross_entropy over logits.float().flatten(0, 1) and targets.flatten(), divided by m
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()) / m
    # END SOLUTION


def weight_grads(mod: nn.Module, x: torch.Tensor, gy: torch.Tensor) -> list[torch.Tensor]:
    """The gradients of ``mod``'s own parameters (in ``mod.parameters(recurse=False)`` order)
    from its input ``x`` and the gradient ``gy`` of its output, computed by the same kernels,
    on the same operands, as autograd's backward of the layer (so bitwise equal to it): a
    ``Linear`` on ``(b, s, i)`` runs ``addmm`` (``mm`` without bias) on the flattened input,
    whose backward is ``dW = dY^T X`` and ``db = sum dY`` over rows; ``LayerNorm`` runs
    ``native_layer_norm_backward`` with the mean and reciprocal deviation of ``x`` (recomputed:
    one normalisation, deterministic); ``Embedding`` runs ``embedding_backward``. Like
    autograd's backward it records no graph (the weights require grad: a recorded graph would
    hang off ``.grad`` and keep the recomputed statistics alive)."""
    with torch.no_grad():
        return _weight_grads(mod, x, gy)


def _weight_grads(mod: nn.Module, x: torch.Tensor, gy: torch.Tensor) -> list[torch.Tensor]:
    if isinstance(mod, nn.Linear):
        x2, g2 = x.flatten(0, -2), gy.reshape(-1, gy.shape[-1])  # (b s, i), (b s, o)
        gw = g2.t().mm(x2)  # autograd's mm_mat2_backward for the column-major weight.t()
        return [gw] if mod.bias is None else [gw, g2.sum([0], keepdim=True).view(-1)]
    if isinstance(mod, nn.LayerNorm):
        shape, w, b = list(mod.normalized_shape), mod.weight, mod.bias
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, shape, w, b, mod.eps)
        grads = torch.ops.aten.native_layer_norm_backward(
            gy, x, shape, mean, rstd, w, b, [False, True, True]
        )
        return [grads[1], grads[2]]
    if isinstance(mod, nn.Embedding):
        pad = -1 if mod.padding_idx is None else mod.padding_idx
        return [
            torch.ops.aten.embedding_backward(
                gy, x, mod.num_embeddings, pad, mod.scale_grad_by_freq, mod.sparse
            )
        ]
    raise TypeError(f"weight_grads: no weight-gradient kernel for {type(mod).__name__}")


@dataclass
class _InFlight:
    """What one (microbatch, chunk) keeps between its forward and its (last) backward."""

    x: torch.Tensor | None  # the stage input (requires grad), None on virtual stage 0
    out: torch.Tensor | None  # the stage output, or the scaled loss on the last virtual stage
    # weight-owning layer, its input and its output (BI drops the output: (layer, input))
    captured: list[tuple]
    out_grads: list[torch.Tensor] = field(default_factory=list)  # filled by BI for BW


class PipelineExecutor:
    """Run ``accounting.pipeline.schedule(cfg.kind, cfg.p, cfg.m, cfg.v)[rank]`` on ``chunks``
    (this rank's ``v`` stages, chunk ``c`` = virtual stage ``c p + rank``, or in a V chunk 0
    = stage ``rank`` and chunk 1 = stage ``2p-1-rank``: ``accounting.pipeline.virtual_stage``).

    ``step(inputs, targets)`` takes the ``m`` microbatches (used on the first and last virtual
    stage only) and returns the summed loss on the rank that owns the last virtual stage
    (``None`` elsewhere). Gradients accumulate into ``.grad``; zero them between steps.
    ``events``: ``(start, end, action)`` per action of the last step (``time.perf_counter``,
    one clock for all processes of a machine): ``end - start`` is the time the rank worked on
    the action (posting receives and sends included): ``start`` is when it began the
    action's work plus the time it then waited for its input, so the time between two
    actions is the time it waited (and a box starts up to the ~0.1 ms the rank spent posting
    its next receive before its input arrived); ``cpu``:
    the CPU time this thread spent in each of them (``time.thread_time``: unlike the wall
    clock, it does not grow while another process holds the core).
    """

    def __init__(self, chunks: list[Stage], cfg: PipeConfig, group: dist.ProcessGroup) -> None:
        if len(chunks) != cfg.v:
            raise ValueError(f"got {len(chunks)} chunks for v={cfg.v}")
        if group.size() != cfg.p:
            raise ValueError(f"group of {group.size()} ranks for p={cfg.p}")
        self.chunks, self.cfg, self.group = chunks, cfg, group
        self.rank = group.rank()
        self.n_virtual = cfg.p * cfg.v
        self.placement = acc.placement(cfg.kind)  # "loop" or "v": which rank holds which stage
        self.actions = acc.schedule(cfg.kind, cfg.p, cfg.m, cfg.v)[self.rank]
        self.events: list[tuple[float, float, acc.Action]] = []
        self.stop_after: str | None = None  # fault injection: raise inside this action
        self._capture: list | None = None
        self.cpu: list[float] = []  # CPU seconds of this thread per action (same order)
        self._split = any(a.kind == "BW" for a in self.actions)
        for chunk in chunks if self._split else ():  # BW needs each weight layer's output
            for mod in chunk.modules():
                if any(True for _ in mod.parameters(recurse=False)):
                    mod.register_forward_hook(self._hook)

    def _hook(self, mod, args, out):
        if self._capture is not None:  # the input, for the weight gradient; the output, for BI
            self._capture.append((mod, args[0].detach(), out))

    # -- addressing: virtual stage k lives on rank k % p (loop) or min(k, 2p-1-k) (V)
    def _vstage(self, a: acc.Action) -> int:
        return acc.virtual_stage(self.rank, a.chunk, self.cfg.p, self.placement)

    def _owner(self, k: int) -> int:
        """The rank holding virtual stage ``k``."""
        return acc.stage_rank(k, self.cfg.p, self.placement)

    def _tag(self, backward: bool, mb: int, k: int) -> int:
        # unique per message: direction, microbatch, receiving virtual stage
        return (mb * self.n_virtual + k) * 2 + int(backward)

    def _post_recv(self, backward: bool, mb: int, k: int) -> None:
        """Post the ``irecv`` of the message virtual stage ``k`` needs (once)."""
        key = (backward, mb, k)
        src = self._owner(k + 1 if backward else k - 1)
        if key in self._posted or src == self.rank:  # posted already, or handed over in memory
            return
        dev = next(self.chunks[0].parameters()).device  # the stages' device (CPU or CUDA)
        buf = torch.empty(self._act_shape, dtype=self.dtype, device=dev)  # (b, s, h)
        # BEGIN SOLUTION hint: dist.irecv into buf from group rank src with tag self._tag(backward, mb, k); keep (work, buf) in self._posted[key]
        work = dist.irecv(buf, group=self.group, group_src=src, tag=self._tag(backward, mb, k))
        self._posted[key] = (work, buf)
        # END SOLUTION

    def _recv(self, backward: bool, mb: int, k: int) -> torch.Tensor:
        if (backward, mb, k) in self._local:  # from this rank's other chunk (a V's tip)
            return self._local.pop((backward, mb, k))
        self._post_recv(backward, mb, k)
        work, buf = self._posted.pop((backward, mb, k))
        t = time.perf_counter()
        work.wait()  # the data is here (usually already: it was posted one action early)
        self._waited += time.perf_counter() - t  # the rank idled: nothing else to do
        return buf

    def _needs(self, a: acc.Action):
        """The message action ``a`` waits for, as ``(backward, mb, k)``, or None."""
        k = self._vstage(a)
        if a.kind == "F" and k > 0:
            return (False, a.microbatch, k)
        if a.kind in ("B", "BI") and k < self.n_virtual - 1:
            return (True, a.microbatch, k)
        return None

    def _send(self, t: torch.Tensor, backward: bool, mb: int, k: int) -> None:
        dest_k = k - 1 if backward else k + 1
        if self._owner(dest_k) == self.rank:  # the next stage is this rank's other chunk
            self._local[(backward, mb, dest_k)] = t
            return
        # BEGIN SOLUTION hint: dist.isend to rank self._owner(dest_k), tag self._tag(backward, mb, dest_k); keep the Work and the tensor in self._pending
        work = dist.isend(
            t, group=self.group, group_dst=self._owner(dest_k), tag=self._tag(backward, mb, dest_k)
        )
        self._pending.append((work, t))  # t must stay alive until the send completes
        # END SOLUTION

    # -- the four actions (the step loop times them: see the class docstring)
    def _forward(self, a: acc.Action) -> None:
        k, mb = self._vstage(a), a.microbatch
        stage = self.chunks[a.chunk]
        if k == 0:
            x, inp = None, self._inputs[mb]
        else:
            x = self._recv(False, mb, k).requires_grad_()
            inp = x
        # BEGIN SOLUTION hint: run the stage with self._capture = [] if self._split and k > 0 (the hook fills it; virtual stage 0 runs its whole backward in BW); on the last virtual stage the output is microbatch_loss(...), add it to self._loss; else isend out.detach() forward; keep _InFlight(x, out, captured) in self._state[(mb, chunk)]
        self._capture = [] if self._split and k > 0 else None  # BW needs the layers' outputs
        out = stage(inp)  # (b, s, h), or (b, s, V) on the last virtual stage
        captured, self._capture = self._capture or [], None
        if k == self.n_virtual - 1:
            out = microbatch_loss(out, self._targets[mb], self.cfg.m)
            self._loss = out.detach() if self._loss is None else self._loss + out.detach()
        else:
            self._send(out.detach(), False, mb, k)  # boundary activation to the next stage
        self._state[(mb, a.chunk)] = _InFlight(x, out, captured)
        # END SOLUTION

    def _out_grad(self, a: acc.Action):
        k = self._vstage(a)
        if k == self.n_virtual - 1:
            return None  # the scaled loss: autograd starts from 1
        return self._recv(True, a.microbatch, k)

    def _backward(self, a: acc.Action) -> None:
        k, key = self._vstage(a), (a.microbatch, a.chunk)
        g = self._out_grad(a)
        # BEGIN SOLUTION hint: torch.autograd.backward(st.out, g) accumulates weight grads and fills st.x.grad; send st.x.grad upstream unless k == 0; drop the state
        st = self._state.pop(key)
        torch.autograd.backward(st.out, g)
        if k > 0:
            self._send(st.x.grad, True, a.microbatch, k)  # input gradient to the previous stage
        # END SOLUTION

    def _backward_input(self, a: acc.Action) -> None:
        k, key = self._vstage(a), (a.microbatch, a.chunk)
        g = self._out_grad(a)
        # BEGIN SOLUTION hint: on virtual stage 0 nobody waits for an input gradient: keep g in st.out_grads for BW; else torch.autograd.grad(st.out, [st.x] + the captured outputs, g) without retain_graph (the saved tensors are freed on the way): send the input gradient upstream now, store the outputs' gradients in st.out_grads for BW; then drop st.out and keep only (layer, input) in st.captured
        st = self._state[key]
        if k == 0:  # no stage before this one: the whole backward waits for BW (PyTorch too)
            st.out_grads = [g]
            return
        wanted = [st.x] + [y for _, _, y in st.captured]
        # no weight is among the inputs, so autograd skips every weight-gradient product; the
        # graph is not retained: what BW needs is the layers' inputs and these gradients
        grads = torch.autograd.grad(st.out, wanted, g)
        self._send(grads[0], True, a.microbatch, k)  # upstream is unblocked at once
        st.out_grads = list(grads[1:])
        st.out, st.captured = None, [(mod, xin) for mod, xin, _ in st.captured]
        # END SOLUTION

    def _backward_weight(self, a: acc.Action) -> None:
        # BEGIN SOLUTION hint: pop the state; on virtual stage 0 run the whole backward, torch.autograd.backward(st.out, the stored g); else for each captured (layer, input) and its stored output gradient, weight_grads(layer, input, grad) gives the layer's own parameters' gradients: add each into p.grad (set it when None)
        st = self._state.pop((a.microbatch, a.chunk))
        if self._vstage(a) == 0:  # BI left the whole backward of the first stage to BW
            torch.autograd.backward(st.out, st.out_grads[0])
            return
        for (mod, xin), gy in zip(st.captured, st.out_grads):
            params = list(mod.parameters(recurse=False))
            # from this layer's input and output gradient to its own weights: dW = dY^T X, ...
            for p, gp in zip(params, weight_grads(mod, xin, gy)):
                p.grad = gp if p.grad is None else p.grad.add_(gp)  # accumulate microbatches
        # END SOLUTION

    def step(self, inputs: list[torch.Tensor], targets: list[torch.Tensor]):
        """Run this rank's action list once over the ``m`` microbatches."""
        if len(inputs) != self.cfg.m or len(targets) != self.cfg.m:
            raise ValueError(f"need m={self.cfg.m} microbatches, got {len(inputs)}")
        b, s = inputs[0].shape
        h = self.chunks[0].blocks[0].ln1.normalized_shape[0]
        self._act_shape, self.dtype = (b, s, h), next(self.chunks[0].parameters()).dtype
        self._inputs, self._targets = inputs, targets
        self._state: dict[tuple[int, int], _InFlight] = {}
        self._pending: list = []
        self._posted: dict = {}
        self._local: dict = {}  # messages between this rank's own chunks (a V's tip)
        self._loss = None
        self.events, self.cpu = [], []
        run = {
            "F": self._forward,
            "B": self._backward,
            "BI": self._backward_input,
            "BW": self._backward_weight,
        }
        needs = [self._needs(a) for a in self.actions]
        for i, a in enumerate(self.actions):
            # post the receive of the next action that needs one before computing this one,
            # so the transfer overlaps the compute (its buffer is one (b, s, h) tensor)
            nxt = next((n for n in needs[i + 1 :] if n is not None), None)
            t, c0 = time.perf_counter(), time.thread_time()
            self._waited = 0.0
            try:
                if nxt is not None:
                    self._post_recv(*nxt)
                if self.stop_after == str(a):
                    raise RuntimeError("injected fault")
                run[a.kind](a)
            except Exception as e:  # name the action: which step of the schedule broke
                raise RuntimeError(
                    f"rank {self.rank} failed in action {a} ({self.cfg.kind}, p={self.cfg.p}, "
                    f"m={self.cfg.m}, v={self.cfg.v}): {type(e).__name__}: {e}"
                ) from e
            # the action's time is this iteration less the wait for its input (the posts
            # above come first: its box starts that much before the input arrived)
            self.events.append((t + self._waited, time.perf_counter(), a))
            self.cpu.append(time.thread_time() - c0)
        for work, _ in self._pending:  # every boundary tensor has left before the step ends
            work.wait()
        self._pending = []
        if self._state:
            raise RuntimeError(f"rank {self.rank}: {sorted(self._state)} never ran backward")
        return self._loss
