"""torch.nn modules over exactjit's ops, for models written against them directly.

    norm = exactjit.nn.RMSNorm(5376, eps=1e-5, device="cuda", dtype=torch.bfloat16)
    y = norm(x)                                                    # F.rms_norm(x, (5376,), w, 1e-5), bit for bit
    y = norm(x, shift=rows[:, :H], scale=rows[:, H:2 * H], index=i)  # ... * (1 + scale[i]) + shift[i]
    norm = exactjit.nn.RMSNorm.from_module(model.norm)            # from a torch.nn.RMSNorm

CUDA only, like the ops: an input a kernel does not take raises exactjit.InvalidArgumentError naming
the rule (exactjit.integrations.diffusers, which patches existing modules, falls back to eager
instead). Importing this module imports torch; `import exactjit` alone does not import it.
"""
import numbers

import torch

import exactjit as _xj

_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm over the last dimension, on exactjit.rms_norm (bitwise equal to it). A
    subclass, so parameters, state_dict ("weight"), loading, initialisation and repr are torch's and
    an nn.RMSNorm state_dict loads as is. Only one normalized dimension, a positive multiple of 4
    (exactjit.rms_norm's rule), in bfloat16, float16 or float32."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
        shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
        if len(shape) != 1:
            raise ValueError(f"exactjit.nn.RMSNorm: normalized_shape must be one int (the last dimension), "
                             f"got {normalized_shape!r}")
        if shape[0] < 4 or shape[0] % 4:
            raise ValueError(f"exactjit.nn.RMSNorm: the normalized size must be a positive multiple of 4, "
                             f"got {shape[0]}")
        if dtype is not None and dtype not in _FLOATS:
            raise ValueError(f"exactjit.nn.RMSNorm: dtype must be bfloat16, float16 or float32, got {dtype}")
        super().__init__(shape, eps, elementwise_affine, device=device, dtype=dtype)

    def forward(self, x, shift=None, scale=None, index=None):
        """rms_norm(x) with this module's weight and eps; with shift, scale (R, H) table views and
        index (S,), also `* (1 + scale.index_select(0, index)) + shift.index_select(0, index)` in the
        same kernel. Differentiable in x, weight, shift and scale."""
        return _xj.rms_norm(x, self.weight, self.eps, shift=shift, scale=scale, index=index)

    @classmethod
    def from_module(cls, module):
        """A new RMSNorm with module's shape, eps, device, dtype and a copy of its weight (and its
        requires_grad). module: a torch.nn.RMSNorm."""
        if not isinstance(module, torch.nn.RMSNorm):
            raise TypeError(f"exactjit.nn.RMSNorm.from_module: expected a torch.nn.RMSNorm, "
                            f"got {type(module).__qualname__}")
        weight = module.weight
        norm = cls(module.normalized_shape, module.eps, module.elementwise_affine,
                   device=None if weight is None else weight.device, dtype=None if weight is None else weight.dtype)
        norm.load_state_dict(module.state_dict())
        if weight is not None:
            norm.weight.requires_grad_(weight.requires_grad)
        return norm


class Timesteps(torch.nn.Module):
    """diffusers' Timesteps (get_timestep_embedding) on exactjit.timestep_sinusoid, bit for bit:
    (T,) timesteps -> (T, num_channels) float32. Same constructor and attributes as diffusers' (no
    parameters), plus max_period, which diffusers' module fixes at 10000."""

    def __init__(self, num_channels, flip_sin_to_cos, downscale_freq_shift, scale=1, max_period=10000):
        super().__init__()
        self.num_channels = num_channels
        self.flip_sin_to_cos = flip_sin_to_cos
        self.downscale_freq_shift = downscale_freq_shift
        self.scale = scale
        self.max_period = max_period

    def forward(self, timesteps):
        return _xj.timestep_sinusoid(timesteps, self.num_channels, max_period=self.max_period,
                                     flip_sin_to_cos=self.flip_sin_to_cos,
                                     downscale_freq_shift=self.downscale_freq_shift, scale=self.scale)

    def extra_repr(self):
        return (f"num_channels={self.num_channels}, flip_sin_to_cos={self.flip_sin_to_cos}, "
                f"downscale_freq_shift={self.downscale_freq_shift}, scale={self.scale}, max_period={self.max_period}")
