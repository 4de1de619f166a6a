"""The optimizer: AdamW, clipping by the global norm, and the learning rate's schedule.

    adamw_update      one tensor's step, the equations as written (what a student writes)
    adamw_step        every tensor's step (weight decay on matrices and embeddings only)
    grad_norm, clip_grad_norm, clip_scale     the gradients' global norm, and clipping to it
    learning_rate     linear warm-up, then cosine decay
    adamw_step_fast   adamw_step for the hot path: the same update in place, in cache-sized
                      chunks on all the cores, clipping folded in; a test holds it equal

Parameters, gradients and moments are dicts of arrays shaped like the model's params
(shapes.flatten names each tensor, e.g. "blocks/0/attn/c_attn/w"). On a GPU (plumbing/device.py)
they are CuPy's arrays and the same lines run there; adamw_step_fast then takes each tensor whole,
in one fused kernel (plumbing/device.py's adamw_twin) instead of fourteen launches.
"""
import math

import numpy as np

from plumbing import device, shapes
from plumbing.parallel import CHUNK, shared_among_cores


# ============================================================================
# 1. AdamW, as written
# ============================================================================

def adamw_update(p, grad, m, v, t, lr, weight_decay, beta1=0.9, beta2=0.999, eps=1e-8):
    """One AdamW step on one tensor, in place (Loshchilov & Hutter, 2019; torch.optim.AdamW's):
    m ← β1 m + (1 - β1) g,  v ← β2 v + (1 - β2) g²,  m̂ = m / (1 - β1ᵗ),  v̂ = v / (1 - β2ᵗ),
    p ← p - lr (m̂ / (√v̂ + ε) + λ p)
    p, grad, m, v [...] (p, m, v are updated); t: this step's number, from 1; weight_decay: λ."""
    m[...] = beta1 * m + (1.0 - beta1) * grad  # momentum: a running mean of the gradient
    v[...] = beta2 * v + (1.0 - beta2) * grad * grad  # and of its square: each weight's own scale
    m_hat = m / (1.0 - beta1 ** t)  # both means start at 0: this undoes that pull in the first steps
    v_hat = v / (1.0 - beta2 ** t)
    p -= lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * p)  # decay: decoupled from the gradient


def decays(name):
    """AdamW's weight decay applies to matrices and embeddings (w, wte, wpe, LoRA's A and B, a classifier's
    score), not to biases and gains."""
    return name.endswith(("/w", "/A", "/B")) or name in ("wte", "wpe", "score")


def new_adamw_state(params):
    """The two moments of every parameter, zero, and the step count."""
    return {"step": 0, "m": {k: np.zeros_like(a) for k, a in shapes.flatten(params).items()},
            "v": {k: np.zeros_like(a) for k, a in shapes.flatten(params).items()}}


def adamw_step(params, grads, state, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """One AdamW step over every tensor, in place; the step count goes up by one."""
    state["step"] += 1
    flat_grads = shapes.flatten(grads)
    for name, p in shapes.flatten(params).items():
        adamw_update(p, flat_grads[name], state["m"][name], state["v"][name], state["step"], lr,
                     weight_decay if decays(name) else 0.0, beta1, beta2, eps)


# ============================================================================
# 2. Clipping and the schedule
# ============================================================================

def grad_norm(grads):
    """‖all gradients‖, as one vector: √(Σ g²) over every element of every tensor."""
    return math.sqrt(sum(float(np.vdot(a, a)) for a in shapes.flatten(grads).values()))


def clip_scale(norm, max_norm):
    """What clipping multiplies every gradient by: max_norm / norm when the norm is larger, else 1."""
    return max_norm / (norm + 1e-6) if max_norm and norm > max_norm else 1.0


def clip_grad_norm(grads, max_norm):
    """Scale every gradient by max_norm / ‖all gradients‖ when that norm is larger. -> the norm before.
    (The training loop does not make this pass: adamw_step_fast scales each chunk as it reads it.)"""
    norm = grad_norm(grads)
    scale = clip_scale(norm, max_norm)
    if scale != 1.0:
        for a in shapes.flatten(grads).values():
            a *= scale
    return norm


def learning_rate(step, max_lr, warmup, total, min_lr=0.0):
    """Linear warm-up to max_lr over `warmup` steps, then cosine decay to min_lr at `total`."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


# ============================================================================
# 3. The hot path's AdamW
# ============================================================================

def adamw_update_fast(p, grad, m, v, tmp, lr, decay, beta1, beta2, eps, correction1, correction2):
    """adamw_update, rearranged so that nothing larger than tmp (scratch of p's shape) is made:
    p ← p (1 - lr·λ) - (lr / (1 - β1ᵗ)) · m / (√v / √(1 - β2ᵗ) + ε), the moments as before.
    decay: lr·λ (0 for biases and gains); correction1, correction2: 1 - β1ᵗ, 1 - β2ᵗ."""
    if decay:
        p *= 1.0 - decay
    m *= beta1
    np.multiply(grad, 1.0 - beta1, out=tmp)
    m += tmp
    v *= beta2
    np.multiply(grad, grad, out=tmp)
    tmp *= 1.0 - beta2
    v += tmp
    np.sqrt(v, out=tmp)
    tmp *= 1.0 / math.sqrt(correction2)
    tmp += eps
    np.divide(m, tmp, out=tmp)
    tmp *= lr / correction1
    p -= tmp


def adamw_step_fast(params, grads, state, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                    grad_scale=1.0):
    """adamw_step for the hot path: each tensor is cut into chunks
    that fit in the cache, so that the update's fourteen operations read memory once instead of
    fourteen times, and the chunks are shared among the cores. grad_scale (clipping's) multiplies
    each chunk of the gradients as it is read, instead of in a pass of its own: clip_grad_norm
    then adamw_step_fast, bit for bit."""
    state["step"] += 1
    t = state["step"]
    flat_grads, jobs = shapes.flatten(grads), []
    on_gpu = device.on_device(flat_grads[next(iter(flat_grads))])  # then a tensor is one chunk, one kernel
    for name, p in shapes.flatten(params).items():
        decay = lr * weight_decay if decays(name) else 0.0
        settings = (lr, decay, beta1, beta2, eps, 1.0 - beta1 ** t, 1.0 - beta2 ** t)
        p, grad, m, v = (a.reshape(-1) for a in (p, flat_grads[name], state["m"][name], state["v"][name]))
        n = p.size if on_gpu else CHUNK
        jobs += [(p[i:i + n], grad[i:i + n], m[i:i + n], v[i:i + n], settings)
                 for i in range(0, p.size, n)]  # views: every array is contiguous
    if on_gpu:
        return adamw_step_on_device(jobs, grad_scale)

    def work(share):
        tmp, scaled = np.empty(CHUNK, np.float32), np.empty(CHUNK, np.float32)
        for p, grad, m, v, settings in share:
            if grad_scale != 1.0:
                grad = np.multiply(grad, grad_scale, out=scaled[:p.size])
            adamw_update_fast(p, grad, m, v, tmp[:p.size], *settings)

    shared_among_cores(work, jobs)


def adamw_step_on_device(jobs, grad_scale):
    """adamw_step_fast's jobs on a GPU: a tensor each, its update one fused kernel (plumbing/device.py's
    adamw_twin, the same equation) where the device has fuse, else adamw_update_fast's calls, whole."""
    fused = device.adamw_twin_for(device.module_of(jobs[0][0]))
    for p, grad, m, v, settings in jobs:
        if fused:
            lr, decay, beta1, beta2, eps, correction1, correction2 = settings
            scalars = (decay, beta1, beta2, eps, lr / correction1, 1.0 / math.sqrt(correction2), grad_scale)
            # as float32: to the kernel a Python float is a double, and it would compute and return float64
            p[...], m[...], v[...] = fused(p, grad, m, v, *map(np.float32, scalars))
        else:
            adamw_update_fast(p, grad * grad_scale, m, v, np.empty_like(p), *settings)
