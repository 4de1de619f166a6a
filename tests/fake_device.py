"""A fake GPU for the tests: CI has none. Its arrays hold NumPy arrays and answer NumPy's calls through
the protocols a CuPy array answers them by (NEP 13 __array_ufunc__, NEP 18 __array_function__, NEP 35
like=), and they are at least as strict as CuPy's: never turned into a NumPy array implicitly (__array__
raises, as CuPy's does), never mixed with a host array in a call (CuPy raises there too), nor in an index
or an assignment (where CuPy would copy it over quietly: here every crossing of the bus is written,
np.asarray(a, like=x)). It counts what a
GPU would pay for: each call (a kernel launch), each copy to the host (.get()), each scalar read
(float(x): a copy and a wait), each copy to the device.

    import fake_device as fake
    params = device.to_device(params, fake)   # this module is the array module, as cupy is
    fake.COUNTS.clear(); ...; fake.COUNTS["calls"]

The module stands where `cupy` would: asarray, random.default_rng, fuse (only where a test sets it:
identity_fuse), cuda.runtime.memGetInfo (FREE bytes), get_default_memory_pool. Arrays' results are
NumPy's own, so a fake-device run equals the CPU's wherever the same calls are made.
"""
import collections
import types

import numpy as np

COUNTS = collections.Counter()  # calls, to_host, scalar_reads, to_device
FREE = [80 * 2 ** 30]  # what memGetInfo says is free (a test may change it)

# np.asarray(a, like=x) and the other creators: NEP 35 hands them to x's __array_function__, with host data
CREATORS = {np.asarray, np.array, np.empty, np.zeros, np.ones, np.full, np.arange, np.linspace, np.ascontiguousarray}


class HostArrayInDeviceCall(TypeError):
    """A NumPy array met a device array in a call: CuPy raises a TypeError there."""


def unwrap(x, where):
    """x's NumPy array for the call; a host array refused; lists and tuples looked into."""
    if isinstance(x, FakeArray):
        return x.a
    if isinstance(x, np.ndarray) and x.ndim > 0:
        raise HostArrayInDeviceCall(f"a host array {x.shape} {x.dtype} in a device {where}: copy it over first "
                                    "(np.asarray(a, like=x))")
    if isinstance(x, (list, tuple)):
        return type(x)(unwrap(v, where) for v in x)
    return x


def wrap(r):
    """A result as the device gives it: arrays, and NumPy's scalars too (CuPy's are 0-d arrays: float() of
    one is a scalar read)."""
    if isinstance(r, (np.ndarray, np.generic)):
        return FakeArray(np.asarray(r))
    if isinstance(r, (list, tuple)):
        return type(r)(wrap(v) for v in r)
    return r


class FakeArray(np.lib.mixins.NDArrayOperatorsMixin):
    """A device array: NumPy's operators come through __array_ufunc__ (the mixin), NumPy's functions
    through __array_function__."""
    __module__ = "fake_device"  # plumbing/device.module_of finds this module, as it finds cupy for cupy's

    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed (a device array: use .get())")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        COUNTS["calls"] += 1
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(unwrap(o, "ufunc's out") for o in out)
            if not all(isinstance(o, FakeArray) for o in out):
                raise HostArrayInDeviceCall("a host array as out= of a device call")
        if "where" in kwargs:
            kwargs["where"] = unwrap(kwargs["where"], "ufunc's where")
        r = getattr(ufunc, method)(*unwrap(inputs, f"call ({ufunc.__name__})"), **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return wrap(r)

    def __array_function__(self, func, types, args, kwargs):
        COUNTS["calls"] += 1
        if func in CREATORS:  # np.asarray(host, like=device): the one way onto the device
            COUNTS["to_device"] += any(isinstance(a, np.ndarray) for a in args)
            return wrap(func(*(a.a if isinstance(a, FakeArray) else a for a in args), **kwargs))
        return wrap(func(*unwrap(args, f"call ({func.__name__})"), **unwrap(kwargs, f"call ({func.__name__})")))

    # what CuPy's arrays have
    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)
    ndim = property(lambda self: self.a.ndim)
    size = property(lambda self: self.a.size)
    nbytes = property(lambda self: self.a.nbytes)
    itemsize = property(lambda self: self.a.itemsize)
    strides = property(lambda self: self.a.strides)
    T = property(lambda self: FakeArray(self.a.T))

    def __len__(self):
        return len(self.a)

    def __repr__(self):
        return f"FakeArray({self.a!r})"

    def __iter__(self):
        return (FakeArray(r) if isinstance(r, np.ndarray) else r for r in self.a)

    def __getitem__(self, key):
        COUNTS["calls"] += 1
        return wrap(self.a[unwrap(key, "index")])

    def __setitem__(self, key, value):
        COUNTS["calls"] += 1
        self.a[unwrap(key, "index")] = unwrap(value, "assignment")

    def method(name, counted=True):
        def call(self, *args, **kwargs):
            COUNTS["calls"] += counted
            return wrap(getattr(self.a, name)(*unwrap(args, name), **unwrap(kwargs, name)))
        call.__name__ = name
        return call

    for _name in ("sum", "mean", "max", "min", "argmax", "argmin", "astype", "copy", "cumsum", "prod", "any", "all",
                  "dot", "clip", "fill", "nonzero", "ravel", "flatten", "var", "std", "argsort", "take", "repeat"):
        locals()[_name] = method(_name)
    for _name in ("reshape", "transpose", "swapaxes", "view", "squeeze"):  # views: no kernel
        locals()[_name] = method(_name, counted=False)
    del _name, method

    # the explicit copies, and the scalar reads (each a copy to the host and a wait for the device)
    def get(self):
        COUNTS["to_host"] += 1
        return self.a.copy()

    def item(self):
        COUNTS["scalar_reads"] += 1
        return self.a.item()

    def __float__(self):
        COUNTS["scalar_reads"] += 1
        return float(self.a)

    def __int__(self):
        COUNTS["scalar_reads"] += 1
        return int(self.a)

    def __index__(self):
        COUNTS["scalar_reads"] += 1
        return self.a.__index__()

    def __bool__(self):
        COUNTS["scalar_reads"] += 1
        return bool(self.a)


# ---- the module, as `cupy` stands ----

def asarray(a, dtype=None):
    if isinstance(a, FakeArray):
        return a if dtype is None or a.dtype == dtype else FakeArray(a.a.astype(dtype))
    COUNTS["to_device"] += 1
    return FakeArray(np.array(a, dtype=dtype))  # a copy, as a copy to a GPU is


def zeros(shape, dtype=np.float64):
    return FakeArray(np.zeros(shape, dtype))


def linspace(*args, **kwargs):
    return FakeArray(np.linspace(*args, **kwargs))


def allclose(a, b, **kwargs):
    return FakeArray(np.asarray(np.allclose(unwrap(a, "allclose"), unwrap(b, "allclose"), **kwargs)))


exp, sqrt = np.exp, np.sqrt  # ufuncs: a FakeArray answers them
empty_like = np.empty_like  # NEP 18: a FakeArray answers it


def identity_fuse(kernel_name=None):
    """cupy.fuse's stand-in, as this module's `fuse` when a test sets it (test_device.py's `fused`): the function
    as it is, its calls NumPy's on the fake arrays. Without it no fused twin stands in, and a run on the fake
    device makes the CPU's own calls, so its numbers are the CPU's. As CuPy, it wants a C name for the kernel."""
    def fused(fn):
        if not (kernel_name or fn.__name__).isidentifier():
            raise ValueError(f'Invalid kernel name: "{kernel_name or fn.__name__}" (give fuse a kernel_name)')
        return fn
    return fused


class Generator:
    """A device's generator: another stream than the host's for the same seed (as cupy's is)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng([seed, 1])

    def random(self, shape, dtype=np.float64):
        return FakeArray(self.rng.random(shape, dtype=dtype))


random = types.SimpleNamespace(default_rng=Generator)
cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(memGetInfo=lambda: (FREE[0], 141 * 2 ** 30)))
# FREE looked up at each call: a test may set another
get_default_memory_pool = lambda: types.SimpleNamespace(free_bytes=lambda: 0)  # noqa: E731
