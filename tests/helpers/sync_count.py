"""Counts, on the CPU, what a GPU run of some code would make the host wait for, and
how many device ops it launches (issue 46's dense pass: 5-12 ms an image in the
augment stage on an H200).

Tensors are *device* tensors when they come from :meth:`SyncCounter.device` (the
inputs a CUDA run would hold on the GPU), from ``Tensor.to(<a device>)`` (an upload),
or from any op with a device tensor among its inputs; the rest are host tensors. Under
the counter (a ``TorchFunctionMode``), on device tensors:

* ``syncs``: ``item``, ``tolist``, ``__bool__`` / ``__int__`` / ``__float__`` /
  ``__index__``, ``numpy``, ``cpu`` / ``to("cpu")``, ``nonzero``, ``masked_select``,
  indexing with a bool tensor (its count comes from the device), ``repeat_interleave``
  without ``output_size``, and ``torch.tensor``
  / ``as_tensor`` of device values; also a *blocking* upload (``.to(device)`` of a
  host tensor without ``non_blocking=True``: torch syncs the stream after it) and
  indexing a device tensor with a Python list (a blocking upload of the index);
* ``ops``: every torch call with a device tensor among its inputs or outputs (each
  one kernel launch or more on CUDA, view ops included: they cost host time);
* ``uploads``: host tensors of more than one element mixed into a device op (each a
  small host-to-device copy on CUDA) plus ``.to(device)`` of host tensors.

On the CPU nothing moves, so the same code runs; what is counted is what it would do
on the GPU.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

_MARK = "_sync_count_device"

_SYNC_METHODS = {
    "item",
    "tolist",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "numpy",
    "cpu",
    "nonzero",
    "masked_select",
    "any",
    "all",
}
_SYNC_RESULT = {"any", "all"}  # syncs only when the result is read: counted by __bool__
# metadata: no kernel, no wait
_NO_OP = {
    "__get__", "__set__", "size", "dim", "shape", "dtype", "device", "numel", "ndim",
    "is_floating_point", "is_contiguous", "stride", "get_device", "element_size",
    "data_ptr", "is_complex", "__len__",
}  # fmt: skip


def is_device(t: object) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, _MARK, False)


def _mark(obj: Any) -> None:
    for t in tree_flatten(obj)[0]:
        if isinstance(t, torch.Tensor):
            try:
                setattr(t, _MARK, True)
            except (AttributeError, RuntimeError):
                pass


def _name(func: Any) -> str:
    return getattr(func, "__name__", str(func))


def _has_device_target(args: tuple, kwargs: dict) -> bool:
    """A ``.to`` naming a device (on the CPU run, the CPU stands for the GPU)."""
    return any(isinstance(a, (torch.device, str)) for a in (*args, *kwargs.values()))


class SyncCounter(TorchFunctionMode):
    """``with SyncCounter() as c: ...``; then ``c.syncs``, ``c.ops``, ``c.uploads`` and
    ``c.where`` (a Counter of the sync kinds, for the failure message)."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0
        self.ops = 0
        self.uploads = 0
        self.where: Counter[str] = Counter()
        self.op_names: Counter[str] = Counter()

    @staticmethod
    def device(*tensors: Any) -> None:
        """Mark ``tensors`` (and tensors in lists, tuples, dicts) as device tensors."""
        _mark(tensors)

    def _sync(self, what: str) -> None:
        self.syncs += 1
        self.where[what] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        flat = tree_flatten((args, kwargs))[0]
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        dev_in = any(is_device(t) for t in tensors)
        if name in _NO_OP:
            out = func(*args, **kwargs)
            if dev_in and name == "__get__":
                _mark(out)
            return out
        self_t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        uploading = (
            name == "cuda"
            or name == "pin_memory"
            or (name == "to" and _has_device_target(args[1:], kwargs))
        )
        if uploading and self_t is not None and not dev_in:
            out = func(*args, **kwargs)
            if name != "pin_memory":
                self.uploads += 1
                if not kwargs.get("non_blocking", False):
                    self._sync(f"blocking upload ({name})")
                _mark(out)
            return out
        if name in ("tensor", "as_tensor") and dev_in:
            self._sync(f"torch.{name} of device values")
        if dev_in:
            if name in _SYNC_METHODS and name not in _SYNC_RESULT:
                self._sync(name)
            if name == "repeat_interleave" and kwargs.get("output_size") is None:
                self._sync("repeat_interleave without output_size")
            if name in ("__getitem__", "__setitem__") and len(args) > 1:
                idx = args[1] if isinstance(args[1], tuple) else (args[1],)
                for i in idx:
                    if isinstance(i, torch.Tensor) and i.dtype == torch.bool:
                        self._sync(f"bool index ({name})")
                    elif isinstance(i, list):
                        self._sync(f"list index ({name})")
            for t in tensors:
                if not is_device(t) and t.numel() > 1:
                    self.uploads += 1
        out = func(*args, **kwargs)
        if name in ("cpu", "numpy", "tolist", "item"):
            return out.clone() if name == "cpu" and out is self_t else out
        out_dev = dev_in
        if out_dev:
            self.ops += 1
            self.op_names[name] += 1
            _mark(out)
        return out
