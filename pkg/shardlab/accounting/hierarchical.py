"""Two-level networks: hierarchical collectives, hybrid sharding (HSDP) and ZeRO-Offload.

A cluster of ``n = inner * outer`` ranks: ``outer`` fast domains (an NVLink node) of
``inner`` ranks each, joined by a slower network. Link ``(alpha_in, beta_in)`` inside a
domain, ``(alpha_out, beta_out)`` between domains (alpha seconds per round, beta bytes/s),
the model of :mod:`.comm` (``T = rounds alpha + V_sent / beta``, ring, bytes sent per rank).

Hierarchical all-reduce of ``V`` bytes (:func:`hierarchical_all_reduce`), per rank::

    1. reduce-scatter inside the domain     V (i-1)/i            on the fast link
    2. all-reduce of the V/i shard across   2 (V/i) (o-1)/o      on the slow link
    3. all-gather inside the domain         V (i-1)/i            on the fast link

The slow link carries ``2 V (o-1)/(o i)`` instead of the flat ring's ``2 V (n-1)/n``
(:func:`flat_all_reduce_time`: a ring over all ``n`` ranks crosses the slow link, and a ring
moves at its slowest link's pace): about ``i`` times less, at the price of
``2 V (i-1)/i`` extra bytes on the fast link and ``2(i-1)`` extra rounds.

HSDP (:func:`hsdp_step_volume`, FSDP's ``HYBRID_SHARD``; FSDP2 ``fully_shard`` on a 2-D
mesh ``("replicate", "shard")``): weights, gradients and optimizer state are sharded ZeRO-3
style over the ``shard`` ranks of a domain and replicated over ``replicate`` domains. Per
rank and step, with ``N`` (padded) parameters and ``q`` bytes per element:

* shard axis: ``comm.grad_accum_volume("zero3", N, shard, q, m, sync, reshard)``
  (all-gathers and reduce-scatters, ``3 q N (s-1)/s`` for one microbatch with resharding);
* replicate axis: one all-reduce of the rank's gradient shard (``q N / s`` bytes) across the
  replicas, once per step after the last reduce-scatter: ``2 (q N / s) (r-1)/r``.

Together these are the hierarchical all-reduce of the gradients with the final all-gather
moved to the next forward (where ZeRO-3 gathers the weights anyway). State per rank is
ZeRO-3's over ``shard`` ranks (``memory.model_state(N, shard, "zero3", recipe)``).

ZeRO-Offload (:func:`offload_step`, Ren et al., 2021): the fp32 master, Adam moments and the
update live on the host; the device keeps low-precision weights and gradients. Per step the
sharded gradients go down to the host and the updated weights come back over PCIe.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _validate as v
from . import comm


@dataclass(frozen=True)
class LevelVolume:
    """Bytes sent per rank by one collective of a hierarchical algorithm, and its time."""

    level: str  # "inner" (fast domain) or "outer" (across domains)
    op: str
    nbytes: float  # full tensor of this collective (comm's V)
    group_size: int
    sent_bytes: float
    seconds: float


def _check_domains(inner: int, outer: int) -> tuple[int, int]:
    return v.positive_int("inner", inner), v.positive_int("outer", outer)


def hierarchical_all_reduce(
    nbytes: float,
    inner: int,
    outer: int,
    alpha_in: float = 0.0,
    beta_in: float = 1.0,
    alpha_out: float = 0.0,
    beta_out: float = 1.0,
) -> list[LevelVolume]:
    """The three collectives of a hierarchical all-reduce of ``nbytes`` (see module doc).

    Returns reduce-scatter (inner), all-reduce of the ``nbytes / inner`` shard (outer) and
    all-gather (inner), each with its per-rank sent bytes and alpha-beta seconds.
    """
    nb = v.nonneg_number("nbytes", nbytes)
    i, o = _check_domains(inner, outer)
    steps = (("inner", "reduce_scatter", nb, i, alpha_in, beta_in),
             ("outer", "all_reduce", nb / i, o, alpha_out, beta_out),
             ("inner", "all_gather", nb, i, alpha_in, beta_in))
    return [
        LevelVolume(
            lvl, op, each, g, comm.sent_bytes(op, each, g), comm.alpha_beta_time(op, each, g, a, b)
        )
        for lvl, op, each, g, a, b in steps
    ]


def hierarchical_all_reduce_time(
    nbytes: float,
    inner: int,
    outer: int,
    alpha_in: float,
    beta_in: float,
    alpha_out: float,
    beta_out: float,
) -> float:
    """Seconds of :func:`hierarchical_all_reduce` (its three collectives in sequence)."""
    levels = hierarchical_all_reduce(nbytes, inner, outer, alpha_in, beta_in, alpha_out, beta_out)
    return sum(lv.seconds for lv in levels)


def flat_all_reduce_time(
    nbytes: float, inner: int, outer: int, alpha_out: float, beta_out: float
) -> float:
    """Seconds of one ring all-reduce over all ``inner * outer`` ranks, paced by the slow link.

    With ``outer > 1`` the ring crosses domain boundaries, and every one of its ``2(n-1)``
    steps waits for the chunk on the slowest link; with ``outer = 1`` pass the fast link.
    """
    i, o = _check_domains(inner, outer)
    return comm.alpha_beta_time("all_reduce", nbytes, i * o, alpha_out, beta_out)


def level_bytes(levels: list[LevelVolume]) -> dict[str, float]:
    """Per-rank sent bytes summed by level: ``{"inner": ..., "outer": ...}``."""
    out = {"inner": 0.0, "outer": 0.0}
    for lv in levels:
        out[lv.level] += lv.sent_bytes
    return out


def hsdp_replicate_traffic(
    grad_bytes: float, shard: int, replicas: int, count: int, alpha: float, beta: float
) -> tuple[float, float]:
    """(seconds, bytes) per rank of HSDP's replicate axis: ``count`` all-reduces that together
    carry this rank's gradient shard ``grad_bytes / shard`` across ``replicas`` ranks.

    ``count``: 1 (one flat shard), or one per unit/layer (ZeRO-3, FSDP2); the bytes do not
    depend on it, the latency term does. The planner (``layout_zero.dp_seconds_bytes``) calls
    :func:`_replicate_traffic`, the same arithmetic without the checks.
    """
    each = grad_bytes / shard / count
    return (comm.collectives_time("all_reduce", each, replicas, count, alpha, beta),
            count * comm.sent_bytes("all_reduce", each, replicas))


def _replicate_traffic(grad_bytes: float, shard: int, replicas: int, count: int,
                       alpha: float, beta: float) -> tuple[float, float]:
    # hsdp_replicate_traffic through comm's unchecked ring core: the same floats
    # (tests/test_accounting_fast_paths.py), for the planner's search of checked inputs
    return comm._ring_collectives("all_reduce", grad_bytes / shard / count, replicas, count,
                                  alpha, beta)


def hsdp_step_volume(
    n_params: int,
    shard: int,
    replicate: int,
    q: float = 2,
    reshard_after_forward: bool = True,
    microbatches: int = 1,
    sync_every_microbatch: bool = True,
) -> dict[str, float]:
    """Per-rank sent bytes of one HSDP step by mesh axis: ``{"shard": ..., "replicate": ...}``.

    ``n_params``: the (padded) parameter count; padded sizes must divide by ``shard``. The
    replicate all-reduce runs once per step whatever ``microbatches`` is (it follows the
    last reduce-scatter, as in FSDP2 with ``set_requires_all_reduce`` off until then).
    """
    n = v.positive_int("n_params", n_params)
    s, r = v.positive_int("shard", shard), v.positive_int("replicate", replicate)
    if n % s:
        raise ValueError(f"n_params={n} is not a multiple of shard={s}: pad every unit first")
    vol = comm.grad_accum_volume(
        "zero3", n, s, q, microbatches, sync_every_microbatch, reshard_after_forward
    )
    _, rep = hsdp_replicate_traffic(v.number("q", q) * n, s, r, 1, 0.0, 1.0)
    return {"shard": vol, "replicate": rep}


@dataclass(frozen=True)
class Offload:
    """ZeRO-Offload per rank and step (bytes and seconds); see :func:`offload_step`."""

    device_bytes: float  # low-precision weights + gradients kept on the device
    host_bytes: float  # fp32 master + Adam moments on the host
    pcie_bytes: float  # gradients down + weights up, per step
    pcie_seconds: float
    host_update_seconds: float
    device_update_seconds: float
    pays: bool  # offloaded step time added (PCIe + host update - device update) < step budget

    @property
    def added_seconds(self) -> float:
        return self.pcie_seconds + self.host_update_seconds - self.device_update_seconds


def offload_step(
    n_params: int,
    dp: int = 1,
    pcie_bandwidth: float = 25e9,
    host_bandwidth: float = 100e9,
    device_bandwidth: float = 3e12,
    slack_seconds: float = 0.0,
    low_bytes: int = 2,
    update_bytes_per_param: int = 32,
    host_bytes_per_param: float = 12,
) -> Offload:
    """ZeRO-Offload of ``n_params`` over ``dp`` ranks (ZeRO-2 gradient sharding).

    Device: ``2 low_bytes N`` (weights and gradients in bf16/fp16, replicated weights,
    as in ZeRO-Offload). Host per rank: ``host_bytes_per_param N / dp`` (mixed Adam's 12: fp32
    master, two moments; a recipe's master + moments in general). PCIe per
    step: the ``low_bytes N / dp`` gradient shard down and the same updated weights up,
    ``2 low_bytes N / dp``, at ``pcie_bandwidth``. Adam is memory-bound: it reads and writes
    ``update_bytes_per_param`` bytes per parameter (master, moments, gradient), taking
    ``update_bytes_per_param N / dp / bandwidth`` on host or device.

    It *pays* when the time added per step fits in ``slack_seconds`` (the part of the
    step that offload can overlap, e.g. the backward of later layers) -- and the real gain
    is memory: ``12 N / dp`` bytes off the device. On a CPU-only machine the "device" and the
    host are the same memory, so nothing here can be measured meaningfully there.
    """
    n = v.positive_int("n_params", n_params)
    d = v.positive_int("dp", dp)
    pcie = v.number("pcie_bandwidth", pcie_bandwidth)
    host = v.number("host_bandwidth", host_bandwidth)
    dev = v.number("device_bandwidth", device_bandwidth)
    slack = v.nonneg_number("slack_seconds", slack_seconds)
    lb = v.positive_int("low_bytes", low_bytes)
    ub = v.positive_int("update_bytes_per_param", update_bytes_per_param)
    hb = v.nonneg_number("host_bytes_per_param", host_bytes_per_param)
    shard = n / d
    pcie_b = 2 * lb * shard
    pcie_s, host_s, dev_s = pcie_b / pcie, ub * shard / host, ub * shard / dev
    return Offload(
        device_bytes=2 * lb * n,
        host_bytes=hb * shard,
        pcie_bytes=pcie_b,
        pcie_seconds=pcie_s,
        host_update_seconds=host_s,
        device_update_seconds=dev_s,
        pays=pcie_s + host_s - dev_s <= slack,
    )
