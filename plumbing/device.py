"""Where the arrays live: the host (NumPy) or a GPU (CuPy), and the one file that knows CuPy.

A CuPy array answers NumPy's own calls: np.exp(x), np.matmul(x, w, out=y), np.take_along_axis(x, i, -1)
on a CuPy array run CuPy's kernels on the GPU, because NumPy hands a call whose arguments are not
its own arrays to the arrays' __array_ufunc__ (NEP 13: ufuncs, +, *=, out=) or __array_function__
(NEP 18: everything else), and np.empty(shape, like=x) makes an array of x's kind (NEP 35). So the
textbook's lines (gpt2_numpy.py, backward.py, optimizer.py) run unchanged on a GPU once the weights
are there: this file puts them there, and brings arrays back. CuPy is imported here alone, and only
when --device gpu asks for it.

    chosen(flag)             "cpu" or "gpu": the flag, else $GPT2_DEVICE, else cpu
    backend(device)          the array module: numpy, or cupy once a GPU has answered (else one line, exit 2)
    check_fits(xp, n, what)  refuse, before loading, what does not fit in the GPU's free memory
    to_device(tree, xp)      every tensor of a dict of arrays (a model's params) on the device, float32
    host(x), to_host(tree)   an array (a dict of them) back on the host: NumPy's, as every file format needs
    on_device(x)             whether x is a device's array (not NumPy's)
    uniform(rng, like)       U[0, 1) draws shaped like `like`, where it is (dropout's masks)
    TWINS, twin(fn, xp)      the element-wise hot spots as one fused kernel each on the device

What stays on the host: the tokenizer, the checks at the door, ids and targets (moved where they
meet the weights), sampling's draws (NumPy's generator: the same seed draws the same way), the
data's order, and every file (read and written through the host).
"""
import functools
import importlib
import math
import os

import numpy as np

from plumbing.errors import UserError

DEVICES = ("cpu", "gpu")
DEVICE_ENV = "GPT2_DEVICE"
INSTALL = "pip install -r requirements-gpu.txt (cupy-cuda12x or cupy-cuda13x, as the driver's CUDA)"


def chosen(flag=None):
    """The device asked for: the flag, else $GPT2_DEVICE, else "cpu"; anything else is a UserError."""
    name = flag or os.environ.get(DEVICE_ENV) or "cpu"
    if name not in DEVICES:
        where = "--device" if flag else f"${DEVICE_ENV}"
        raise UserError(f"{where} must be one of {', '.join(DEVICES)}, got {name!r}")
    return name


def backend(device="cpu"):
    """The array module of a device: numpy for the CPU; for the GPU, cupy, once a probe allocation
    has answered (TF32 is off unless $CUPY_TF32=1 asks for it: docs/gpu.md). Without CuPy, or with
    CuPy and no GPU (no driver, or one too old), a UserError that says which, before any work."""
    if chosen(device) == "cpu":
        return np
    try:
        xp = importlib.import_module("cupy")
    except ImportError as e:
        raise UserError(f"--device gpu needs CuPy, which is not installed ({e.msg}): {INSTALL}") from None
    try:
        xp.zeros(1, np.float32) + 1  # the probe: the first allocation is where a missing GPU shows
    except Exception as e:  # CUDARuntimeError, CUDADriverError, a missing libcuda: each its own class
        raise UserError(f"--device gpu: CuPy is installed but no GPU answers ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else 'no reason given'})") from None
    return xp


def free_bytes(xp):
    """The device's free memory, in bytes (CuPy's memory pool's idle blocks count as free)."""
    free, _ = xp.cuda.runtime.memGetInfo()
    return free + xp.get_default_memory_pool().free_bytes()


def check_fits(xp, needed, what):
    """Refuse, before anything is loaded, `needed` bytes that the GPU does not have free."""
    if xp is np:
        return
    free = free_bytes(xp)
    if needed > free:
        from plumbing.memory import size  # as the host's check says sizes; not the model's import (tests/test_layout)

        raise UserError(f"{what} needs {size(needed)} on the GPU, but {size(free)} are free there: "
                        "use a smaller model, batch or context, or --device cpu")


def tree_bytes(tree):
    """The bytes of every array in a nested dict/list of arrays."""
    if isinstance(tree, dict):
        return sum(tree_bytes(v) for v in tree.values())
    if isinstance(tree, list):
        return sum(tree_bytes(v) for v in tree)
    return getattr(tree, "nbytes", 0)


def mapped(fn, tree):
    """fn on every array of a nested dict/list, the rest (a LoRA scale, a label) kept as it is."""
    if isinstance(tree, dict):
        return {k: mapped(fn, v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [mapped(fn, v) for v in tree]
    return fn(tree) if hasattr(tree, "shape") else tree


def to_device(tree, xp):
    """Every array of tree (a model's params: read-only maps of the file) copied once onto xp's device,
    as float32 (its ints as they are; one there already stays); numpy: the tree itself, nothing copied."""
    if xp is np:
        return tree
    def moved(a):
        return a if on_device(a) else xp.asarray(a if a.dtype.kind in "iub" else np.asarray(a, np.float32))

    return mapped(moved, tree)


def on_device(x):
    """x is an array of a device (it answers NumPy's calls, NEP 18, but is not NumPy's)."""
    return hasattr(x, "__array_function__") and not isinstance(x, (np.ndarray, np.generic))


def host(x):
    """x on the host: a device's array copied back (CuPy's .get(), the explicit copy); anything else as it is."""
    return x.get() if on_device(x) else x


def to_host(tree):
    """Every array of a nested dict/list on the host (what a file is written from)."""
    return mapped(host, tree)


def module_of(x):
    """The array module a device's array belongs to (cupy for a cupy.ndarray)."""
    return importlib.import_module(type(x).__module__.partition(".")[0])


def uniform(rng, like):
    """Draws in [0, 1), float32, shaped like `like` and where it is: on the host NumPy's rng draws them;
    on a device its own generator, seeded from rng (the same run draws the same masks, but not the host's:
    a device's generator is another algorithm; drawing on the host and copying would cross the bus)."""
    if not on_device(like):
        return rng.random(like.shape, dtype=np.float32)
    seed = int(rng.integers(2 ** 63))
    return module_of(like).random.default_rng(seed).random(like.shape, dtype=np.float32)


# ============================================================================
# The fused twins: an element-wise hot spot as one kernel
# ============================================================================
# On a GPU every NumPy call is a kernel launch (~5-10 µs) and a pass over its arrays in the device's
# memory: gelu_backward_fast is 14 passes over [B, T, 4C], AdamW's update 14 per tensor (148 tensors in
# 124M). cupy.fuse compiles a function of element-wise operations into one kernel. Each twin below is the
# same equation as its plain form, written as one expression of arithmetic and the `exp`, `sqrt` it is
# given (NumPy's in the test that holds the two equal, CuPy's, fused, on the GPU). They stand in where the
# CPU would chunk: in_chunks (the backward's GELU) and adamw_step_fast; the forward's gelu_fast is called
# as written (7 passes), since ffn asks for no helper.

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)  # gpt2_numpy's constants (this file cannot import a chapter)
GELU_CUBIC = 0.044715


def gelu_backward_twin(x, dy, exp):
    """backward.gelu_backward_fast: (s + s (1 - s) u) dy,  s = 1 / (1 + exp(-2y)),  u = x (2a + 6b x²)"""
    a, b = SQRT_2_OVER_PI, GELU_CUBIC * SQRT_2_OVER_PI
    s = 1.0 / (1.0 + exp(x * (-2.0 * a - 2.0 * b * x * x)))
    return (s + s * (1.0 - s) * (x * (2.0 * a + 6.0 * b * x * x))) * dy


def adamw_twin(p, grad, m, v, decay, beta1, beta2, eps, step_size, rsqrt_c2, grad_scale, sqrt):
    """optimizer.adamw_update_fast, with clipping's grad_scale: -> the new p, m, v (the caller writes them
    back). decay = lr·λ, step_size = lr / (1 - β1ᵗ), rsqrt_c2 = 1 / √(1 - β2ᵗ): Python floats, from
    the host."""
    g = grad * grad_scale
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * (g * g)
    return p * (1.0 - decay) - step_size * (m / (sqrt(v) * rsqrt_c2 + eps)), m, v


TWINS = {"gelu_backward_fast": gelu_backward_twin}  # the row-wise functions in_chunks is given, by name


@functools.lru_cache(maxsize=None)
def twin(fn, xp):
    """The fused twin of fn (TWINS, by its name) as one kernel for xp's device (cupy.fuse, compiled at its
    first call and kept). None where there is none (NumPy, an array type without fuse, a function with no
    twin), and None where the twin does not give what fn gives on a probe: in a handout fn may be the
    student's own (handout.py TWINS), which then runs as it is, in whole-array calls (a right one passes
    the probe, having run on it, and the kernel stands in for it)."""
    if not hasattr(xp, "fuse") or fn.__name__ not in TWINS:
        return None
    plain, exp = TWINS[fn.__name__], xp.exp
    fused = xp.fuse(kernel_name=fn.__name__)(lambda x, dy: plain(x, dy, exp))  # a C name: a lambda's is not one
    probe = xp.linspace(-8, 8, 257, dtype=np.float32).reshape(1, -1)
    want = fn(probe, probe)  # the student's error, if any, shows here as anywhere
    try:
        same = bool(xp.allclose(fused(probe, probe), want, rtol=1e-5, atol=1e-6))
    except Exception:  # a kernel that would not compile: the plain form runs (tests/test_gpu.py would say so)
        return None
    return fused if same else None


@functools.lru_cache(maxsize=None)
def adamw_twin_for(xp):
    """adamw_twin as one kernel for xp's device (-> the new p, m, v); None without fuse (NumPy)."""
    if not hasattr(xp, "fuse"):
        return None
    sqrt = xp.sqrt
    fused = xp.fuse(kernel_name="adamw_twin")(
        lambda p, grad, m, v, decay, beta1, beta2, eps, step_size, rsqrt_c2, grad_scale:
        adamw_twin(p, grad, m, v, decay, beta1, beta2, eps, step_size, rsqrt_c2, grad_scale, sqrt))
    ones = xp.asarray(np.ones(8, np.float32))
    try:  # compiled once here: a kernel that would not compile leaves adamw_update_fast's calls
        fused(ones, ones, ones, ones, *np.ones(7, np.float32))
    except Exception:
        return None
    return fused
