"""The one calling contract every MLA prefill wrapper implements.

Why a base class: the agent instantiates "the local kernel wrapper for the backend
the service chose" without knowing which one it is, and the chunked-context merge
downstream (vLLM's ``merge_attn_states``) needs every backend to hand back the same
output and LSE layout. Everything that can be checked without running a kernel is
checked here, once, so that a malformed batch raises a ``ValueError`` naming the
argument instead of producing a silently wrong answer on one backend only.

Contract (see ``kernels/README.md``):

* ``cls.create(num_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
  softmax_scale, dtype, device)`` builds an instance, or raises
  :class:`BackendUnavailable` whose text carries the same reasons as the torch-free
  spec's ``validate()`` (no CUDA device, wrong compute capability, dims, dtype,
  missing package), plus any import failure of the backend's package.
* ``inst.prefill(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
  *, causal=True, return_lse=False)`` takes ragged packed tensors
  ``q, k: [T, H, qk_nope + qk_rope]``, ``v: [T_k, H, v_head_dim]``,
  ``cu_seqlens_*: int32 [B + 1]`` on the kernel's device, and returns
  ``out: [T_q, H, v_head_dim]`` in the kernel's dtype, or ``(out, lse)`` with
  ``lse: float32 [H, T_q]`` in natural log when ``return_lse`` is true.
* Causal masks are aligned bottom-right: query ``i`` of a sequence with ``L_q``
  queries and ``L_k`` keys sees keys ``j <= i + (L_k - L_q)`` (the last query sees
  every key), which is what a context chunk of new tokens after a cached prefix needs.
* ``inst.impl`` names the code path really used (``flashinfer-fa3``,
  ``torch-bundled-fa2``, ...), so benchmark rows and the agent's reports say what ran.
"""

from __future__ import annotations

import abc
import importlib.util
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import torch
from mla_switchboard.core.specs import (
    SPECS,
    Backend,
    Capability,
    Dtype,
    MLADims,
    SelectionContext,
    parse_dtype,
)
from torch import Tensor

__all__ = [
    "BackendUnavailable",
    "MLAPrefillKernel",
    "RaggedBatch",
    "canonical_device",
    "device_capability",
    "lse_base2_to_contract",
    "resolve_dtype",
]

_TORCH_TO_SPEC: dict[torch.dtype, Dtype] = {
    torch.bfloat16: Dtype.BFLOAT16,
    torch.float16: Dtype.FLOAT16,
    torch.float32: Dtype.FLOAT32,
}
_SPEC_TO_TORCH: dict[Dtype, torch.dtype] = {v: k for k, v in _TORCH_TO_SPEC.items()}

K = TypeVar("K", bound="MLAPrefillKernel")


class BackendUnavailable(RuntimeError):
    """A backend cannot run with these arguments on this machine.

    ``reasons`` are the spec's ``validate()`` strings (plus, after those pass, any
    import or probe failure of the backend's own package), so the agent can report
    exactly what the service would have said.
    """

    def __init__(self, backend: Backend, reasons: Sequence[str]) -> None:
        self.backend = backend
        self.reasons: list[str] = list(reasons)
        super().__init__(f"{backend} cannot run here: " + "; ".join(self.reasons))


def resolve_dtype(dtype: torch.dtype | str | Dtype) -> tuple[torch.dtype, Dtype]:
    """Accept a torch dtype, a ``Dtype`` or any spelling ``parse_dtype`` accepts."""
    if isinstance(dtype, torch.dtype):
        try:
            return dtype, _TORCH_TO_SPEC[dtype]
        except KeyError:
            raise ValueError(
                f"dtype {dtype} not supported; accepted: torch.bfloat16, torch.float16, "
                "torch.float32"
            ) from None
    if isinstance(dtype, Dtype):
        return _SPEC_TO_TORCH[dtype], dtype
    if isinstance(dtype, str):
        spec = parse_dtype(dtype)
        return _SPEC_TO_TORCH[spec], spec
    raise ValueError(f"dtype must be a torch.dtype or a string, got {type(dtype).__name__}")


def canonical_device(device: torch.device | str | int) -> torch.device:
    """``"cuda"`` becomes ``cuda:<current>`` when CUDA is there, so equality checks work.

    Without CUDA the index stays unset; ``create`` then reports "no CUDA device".
    """
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def device_capability(device: torch.device) -> Capability | None:
    """The compute capability of ``device``, or None when it is no usable CUDA device.

    Module-level (not a method) so CPU tests can stand in a capability and prove
    that, e.g., TRTLLM_RAGGED refuses Hopper with the spec's reason.
    """
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        return None
    major, minor = torch.cuda.get_device_capability(index)
    return Capability(major, minor)


def lse_base2_to_contract(lse: torch.Tensor) -> torch.Tensor:
    """A ``[T, H]`` base-2 LSE (FlashInfer's and trtllm-gen's) as the contract's ``[H, T]`` ln."""
    return (lse.float() * math.log(2.0)).t().contiguous()


def _installed(packages: Sequence[str]) -> dict[str, str]:
    """Which of ``packages`` are importable, without importing them."""
    found: dict[str, str] = {}
    for name in packages:
        try:
            if importlib.util.find_spec(name) is not None:
                found[name] = "installed"
        except (ImportError, ValueError):  # broken namespace packages
            continue
    return found


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    ia = a.index if a.index is not None else 0
    ib = b.index if b.index is not None else 0
    return ia == ib


class RaggedBatch:
    """A validated ragged batch: device offsets plus their host copy.

    Backends need the lengths on the host anyway (FlashInfer plans from host
    indptrs, cuDNN sizes its graph from them, the reference loops over them); taking
    them once here keeps every backend to one device-to-host copy per new batch.

    Everything a backend reads per call is computed once, at construction. The base
    class hands the *same object* back while the offsets tensors, their versions, the
    declared maxima and the token counts are unchanged (every layer of one forward
    pass), so a backend can keep its per-batch state (a FlashInfer plan, a cuDNN
    graph and its metadata) keyed on the object's identity instead of building a
    Python key out of token counts on every call.
    """

    __slots__ = (
        "_kv_lengths",
        "batch_size",
        "cu_seqlens_k",
        "cu_seqlens_q",
        "equal_lengths",
        "host_cu_k",
        "host_cu_q",
        "lens_k",
        "lens_q",
        "longest_k",
        "longest_q",
        "max_seqlen_k",
        "max_seqlen_q",
        "self_attention",
    )

    def __init__(
        self,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        host_cu_q: tuple[int, ...],
        host_cu_k: tuple[int, ...],
        max_seqlen_q: int,
        max_seqlen_k: int,
    ) -> None:
        self.cu_seqlens_q = cu_seqlens_q
        self.cu_seqlens_k = cu_seqlens_k
        self.host_cu_q = host_cu_q
        self.host_cu_k = host_cu_k
        self.max_seqlen_q = max_seqlen_q
        self.max_seqlen_k = max_seqlen_k
        self.batch_size = len(host_cu_q) - 1
        self.lens_q = tuple(host_cu_q[i + 1] - host_cu_q[i] for i in range(self.batch_size))
        self.lens_k = tuple(host_cu_k[i + 1] - host_cu_k[i] for i in range(self.batch_size))
        self.longest_q = max(self.lens_q, default=0)
        self.longest_k = max(self.lens_k, default=0)
        #: True when every sequence has as many queries as keys (no context chunk).
        self.self_attention = host_cu_q == host_cu_k
        #: True when all sequences share one query length and one key length: the
        #: packed batch is then also a dense ``[B, S, H, D]`` tensor without padding.
        self.equal_lengths = len(set(self.lens_q)) <= 1 and len(set(self.lens_k)) <= 1
        self._kv_lengths: torch.Tensor | None = None

    def kv_lengths(self) -> torch.Tensor:
        """Per-sequence key lengths on the device, computed once per batch (not per layer).

        Kernels that take lengths beside the offsets (trtllm-gen, tokenspeed) share it.
        """
        if self._kv_lengths is None:
            cu = self.cu_seqlens_k
            self._kv_lengths = cu[1:] - cu[:-1]
        return self._kv_lengths

    def __repr__(self) -> str:
        return f"RaggedBatch(lens_q={self.lens_q}, lens_k={self.lens_k})"


class _Validated:
    """What the last full check accepted: the fast path's comparison record."""

    __slots__ = ("batch", "causal", "cu_k", "cu_q", "k_shape", "q_shape", "v_shape", "vk", "vq")

    def __init__(
        self,
        batch: RaggedBatch,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
    ) -> None:
        self.batch = batch
        self.cu_q = batch.cu_seqlens_q
        self.cu_k = batch.cu_seqlens_k
        self.vq = batch.cu_seqlens_q._version
        self.vk = batch.cu_seqlens_k._version
        self.q_shape = q.shape
        self.k_shape = k.shape
        self.v_shape = v.shape
        self.causal = causal


class _HostOffsets:
    """One-entry cache of a cu_seqlens tensor's host copy.

    Keyed by the tensor object and its version counter (bumped by every in-place
    write, views included), and holding a reference so the object cannot be freed
    and its id reused. The same offsets passed again (every layer of a forward
    pass) cost no device synchronisation.
    """

    def __init__(self) -> None:
        self._tensor: torch.Tensor | None = None
        self._version = -1
        self._values: tuple[int, ...] = ()

    def get(self, t: torch.Tensor) -> tuple[int, ...]:
        version = t._version
        if t is self._tensor and version == self._version:
            return self._values
        values = tuple(int(x) for x in t.tolist())
        self._tensor, self._version, self._values = t, version, values
        return values


class MLAPrefillKernel(abc.ABC):
    """Abstract MLA prefill kernel: validated inputs in, ``out`` (and LSE) out.

    Subclasses set ``backend``, implement ``_build`` (heavy imports and one-time
    setup; may raise :class:`BackendUnavailable`) and ``_forward`` (the kernel call on
    already validated inputs). They never re-check shapes.
    """

    backend: ClassVar[Backend]
    impl: str

    def __init__(
        self,
        *,
        num_heads: int,
        dims: MLADims,
        softmax_scale: float,
        dtype: torch.dtype,
        device: torch.device,
        capability: Capability | None,
    ) -> None:
        self.num_heads = num_heads
        self.dims = dims
        self.softmax_scale = softmax_scale
        self.dtype = dtype
        self.device = device
        self.capability = capability
        self.impl = "unbuilt"
        self._host_q = _HostOffsets()
        self._host_k = _HostOffsets()
        self._last: _Validated | None = None

    # ----------------------------------------------------------------- creation
    @classmethod
    def create(
        cls: type[K],
        num_heads: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        softmax_scale: float,
        dtype: torch.dtype | str,
        device: torch.device | str | int,
        **options: Any,
    ) -> K:
        """Build an instance after checking the backend's spec on this device.

        ``options`` are backend-specific knobs (documented on each subclass, e.g.
        ``impl=`` to force a code path); unknown ones raise ``TypeError``.
        """
        for name, value in (
            ("num_heads", num_heads),
            ("qk_nope_head_dim", qk_nope_head_dim),
            ("qk_rope_head_dim", qk_rope_head_dim),
            ("v_head_dim", v_head_dim),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
            # qk_rope_head_dim may be 0 (GLM-5-Next's (256, 0, 256)); the others may not.
            if value < 0 or (value == 0 and name != "qk_rope_head_dim"):
                kind = "non-negative" if name == "qk_rope_head_dim" else "positive"
                raise ValueError(f"{name} must be a {kind} int, got {value!r}")
        if (
            isinstance(softmax_scale, bool)
            or not isinstance(softmax_scale, int | float)
            or not math.isfinite(softmax_scale)
            or softmax_scale <= 0
        ):
            raise ValueError(
                f"softmax_scale must be a positive finite number, got {softmax_scale!r}"
            )
        torch_dtype, spec_dtype = resolve_dtype(dtype)
        dev = canonical_device(device)
        cap = device_capability(dev)
        dims = MLADims(qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
        spec = SPECS[cls.backend]
        ctx = SelectionContext(
            capability=cap,
            dims=dims,
            dtype=spec_dtype,
            packages=_installed(spec.package_names),
        )
        reasons = spec.validate(ctx)
        if not spec.needs_gpu and dev.type == "cuda" and cap is None:
            reasons.append(f"device {dev} requested but no CUDA device is available")
        if reasons:
            raise BackendUnavailable(cls.backend, reasons)
        inst = cls(
            num_heads=num_heads,
            dims=dims,
            softmax_scale=float(softmax_scale),
            dtype=torch_dtype,
            device=dev,
            capability=cap,
        )
        inst._build(**options)
        return inst

    def _build(self, **options: Any) -> None:
        """One-time setup (imports, workspaces, path choice); sets ``self.impl``."""
        if options:
            raise TypeError(f"{self.backend} takes no options, got {sorted(options)}")

    # ------------------------------------------------------------------ calling
    def prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        *,
        causal: bool = True,
        return_lse: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention over a ragged batch; see the module docstring for the contract.

        Raises ValueError (naming the argument) for any malformed input before a
        kernel runs. ``out`` may be a strided view (e.g. the slice of a padded
        output); ``lse`` is always a contiguous float32 ``[H, T_q]`` tensor.
        """
        last = self._last
        try:
            fast = (
                last is not None
                and cu_seqlens_q is last.cu_q
                and cu_seqlens_k is last.cu_k
                and causal is last.causal
                and (return_lse is False or return_lse is True)
                and cu_seqlens_q._version == last.vq
                and cu_seqlens_k._version == last.vk
                and max_seqlen_q.__class__ is int
                and max_seqlen_k.__class__ is int
                and max_seqlen_q == last.batch.max_seqlen_q
                and max_seqlen_k == last.batch.max_seqlen_k
                and q.shape == last.q_shape
                and k.shape == last.k_shape
                and v.shape == last.v_shape
                and q.dtype is self.dtype
                and k.dtype is self.dtype
                and v.dtype is self.dtype
                and q.device == self.device
                and k.device == self.device
                and v.device == self.device
            )
        except AttributeError:  # not tensors: the full check names the argument
            fast = False
        if fast:
            # Same offsets tensors (unchanged), same maxima, same shapes: every check
            # below would pass again, and the batch's host copy is already here.
            assert last is not None
            batch = last.batch
        else:
            if not isinstance(causal, bool):
                raise ValueError(f"causal must be a bool, got {causal!r}")
            if not isinstance(return_lse, bool):
                raise ValueError(f"return_lse must be a bool, got {return_lse!r}")
            batch = self.check_inputs(
                q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal
            )
            self._last = _Validated(batch, q, k, v, causal)
        if q.shape[0] == 0:
            out = q.new_empty((0, self.num_heads, self.dims.v_head_dim))
            lse = torch.empty((self.num_heads, 0), dtype=torch.float32, device=q.device)
            return (out, lse) if return_lse else out
        out, lse = self._forward(q, k, v, batch, causal=causal, return_lse=return_lse)
        if return_lse:
            assert lse is not None
            return out, lse
        return out

    def direct_calls(
        self, inputs: dict[str, Any], *, causal: bool, return_lse: bool
    ) -> dict[str, Any]:
        """The backend library's own call(s) for the same work, for benchmarks.

        ``inputs`` are the contract's keyword arguments. Returns ``{name: fn}`` where
        each zero-argument ``fn`` makes the library call a hand-written caller would
        make, everything set up once beforehand (planned, graphs built, buffers
        allocated). ``kernels.measure.compare_direct`` times them beside
        ``prefill``. Empty for backends that are no library call (TORCH_SDPA).
        """
        return {}

    @abc.abstractmethod
    def _forward(
        self, q: Tensor, k: Tensor, v: Tensor, batch: RaggedBatch, *, causal: bool, return_lse: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Run the kernel on validated inputs; return ``(out, lse or None)``."""

    # --------------------------------------------------------------- validation
    def check_inputs(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        *,
        causal: bool,
    ) -> RaggedBatch:
        """Every check the contract promises, raising ValueError with the argument named.

        Shapes, dtypes and devices cost nothing; the value checks (offsets start at 0,
        never decrease, end at the token counts, respect the declared maxima) need the
        offsets on the host, which is one small copy per new offsets tensor (cached).
        """
        _raise_first(self._static_reasons(q, k, v, cu_seqlens_q, cu_seqlens_k))
        _raise_first(
            _max_seqlen_reason(name, value)
            for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k))
        )
        host_q = self._host_q.get(cu_seqlens_q)
        host_k = self._host_k.get(cu_seqlens_k)
        _raise_first(
            _offsets_values_reason(name, host, total, max_len)
            for name, host, total, max_len in (
                ("cu_seqlens_q", host_q, q.shape[0], max_seqlen_q),
                ("cu_seqlens_k", host_k, k.shape[0], max_seqlen_k),
            )
        )
        _raise_first(_sequence_reasons(host_q, host_k, causal))
        return RaggedBatch(cu_seqlens_q, cu_seqlens_k, host_q, host_k, max_seqlen_q, max_seqlen_k)

    def _static_reasons(
        self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor
    ) -> Iterator[str | None]:
        """The checks that need no offsets values, in order; each runs once those before pass."""
        for name, t in (("q", q), ("k", k), ("v", v)):
            yield _token_tensor_reason(name, t, self)
        yield _head_shapes_reason(q, k, v, self.num_heads, self.dims)
        for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            yield _offsets_tensor_reason(name, t, self)
        if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
            yield (
                "cu_seqlens_q and cu_seqlens_k must have the same length (batch_size + 1), "
                f"got {cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}"
            )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(impl={self.impl!r}, num_heads={self.num_heads}, "
            f"dims={self.dims}, dtype={self.dtype}, device={self.device})"
        )


# ------------------------------------------------------------------ input checks
# Each check returns the reason an argument is malformed, or None; ``check_inputs``
# raises the first reason, so a check may assume every check before it passed.


def _raise_first(reasons: Iterable[str | None]) -> None:
    """Raise ValueError with the first reason given; the rest are never computed."""
    for reason in reasons:
        if reason is not None:
            raise ValueError(reason)


def _device_reason(name: str, t: torch.Tensor, kernel: MLAPrefillKernel) -> str | None:
    if _same_device(t.device, kernel.device):
        return None
    return (
        f"{name} is on {t.device} but this {kernel.backend} kernel was created for {kernel.device}"
    )


def _token_tensor_reason(name: str, t: object, kernel: MLAPrefillKernel) -> str | None:
    """q, k or v: a 3-D tensor of the kernel's dtype on its device."""
    if not isinstance(t, torch.Tensor):
        return f"{name} must be a torch.Tensor, got {type(t).__name__}"
    if t.dim() != 3:
        return f"{name} must be 3-D [tokens, heads, head_dim], got shape {tuple(t.shape)}"
    if t.dtype != kernel.dtype:
        return (
            f"{name} has dtype {t.dtype} but this {kernel.backend} kernel was created "
            f"for {kernel.dtype}"
        )
    return _device_reason(name, t, kernel)


def _head_shapes_reason(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, h: int, dims: MLADims
) -> str | None:
    """Heads and head dims as created, and as many value tokens as key tokens."""
    dqk, dv = dims.qk_head_dim, dims.v_head_dim
    if tuple(q.shape[1:]) != (h, dqk):
        return f"q must have shape [T_q, {h}, {dqk}] (heads, qk_nope+qk_rope), got {tuple(q.shape)}"
    if tuple(k.shape[1:]) != (h, dqk):
        return f"k must have shape [T_k, {h}, {dqk}] (heads, qk_nope+qk_rope), got {tuple(k.shape)}"
    if tuple(v.shape[1:]) != (h, dv):
        return f"v must have shape [T_k, {h}, {dv}] (heads, v_head_dim), got {tuple(v.shape)}"
    if k.shape[0] != v.shape[0]:
        return f"k and v must have the same number of tokens, got {k.shape[0]} and {v.shape[0]}"
    return None


def _offsets_tensor_reason(name: str, t: object, kernel: MLAPrefillKernel) -> str | None:
    """cu_seqlens_*: a 1-D int32 tensor of at least two entries on the kernel's device."""
    if not isinstance(t, torch.Tensor):
        return f"{name} must be a torch.Tensor, got {type(t).__name__}"
    if t.dtype != torch.int32:
        return f"{name} must have dtype torch.int32, got {t.dtype}"
    if t.dim() != 1 or t.shape[0] < 2:
        return f"{name} must be 1-D with batch_size + 1 >= 2 entries, got shape {tuple(t.shape)}"
    return _device_reason(name, t, kernel)


def _max_seqlen_reason(name: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"{name} must be a non-negative int, got {value!r}"
    return None


def _offsets_values_reason(
    name: str, host: tuple[int, ...], total: int, max_len: int
) -> str | None:
    """Offsets start at 0, never decrease, end at the token count, respect the maximum."""
    if host[0] != 0:
        return f"{name} must start at 0, got {host[0]}"
    for i in range(len(host) - 1):
        if host[i + 1] < host[i]:
            return (
                f"{name} must be non-decreasing, but entry {i + 1} ({host[i + 1]}) "
                f"< entry {i} ({host[i]})"
            )
    if host[-1] != total:
        tensor = "q" if name.endswith("_q") else "k/v"
        return f"{name}[-1] = {host[-1]} must equal the number of {tensor} tokens ({total})"
    longest = max(host[i + 1] - host[i] for i in range(len(host) - 1))
    arg = "max_seqlen_q" if name.endswith("_q") else "max_seqlen_k"
    if longest > max_len:
        return f"{arg} = {max_len} is smaller than the longest sequence in {name} ({longest})"
    return None


def _sequence_reasons(
    host_q: tuple[int, ...], host_k: tuple[int, ...], causal: bool
) -> Iterator[str | None]:
    """Every sequence's queries have keys to attend to (all of them, when causal)."""
    for i in range(len(host_q) - 1):
        lq = host_q[i + 1] - host_q[i]
        lk = host_k[i + 1] - host_k[i]
        if lq > 0 and lk == 0:
            yield (
                f"sequence {i} has {lq} query tokens but no key/value tokens; "
                "its output would be undefined"
            )
        if causal and lq > lk:
            yield (
                f"sequence {i} has more query tokens ({lq}) than key tokens ({lk}); with a "
                "bottom-right causal mask its first queries would see no key"
            )
