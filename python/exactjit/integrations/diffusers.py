"""exactjit inside diffusers' MiniMax-H3 transformer (written against diffusers 0.42.1).

    from exactjit.integrations import diffusers as xj_diffusers
    xj_diffusers.apply(transformer)   # a MiniMaxH3Transformer3DModel, MiniMaxH3TransformerBlock or norm_out
    ...
    xj_diffusers.remove(transformer)

apply() sets `forward` on module *instances* (Liger-Kernel style); classes, parameters, buffers,
state_dict and module hooks are untouched, and the patched forwards still call adaln_proj, attn, ff
and norm_out.linear as modules, so their own hooks and patches keep working. What is swapped:

  * time_proj: get_timestep_embedding -> exactjit.timestep_sinusoid;
  * every block: norm1 and its AdaLN modulation -> one exactjit.rms_norm; the first gated residual
    and norm2 with its modulation, which it feeds -> one exactjit.gate_residual_rms_norm; the second
    gated residual -> exactjit.gate_residual;
  * norm_out: its norm and modulation -> one exactjit.rms_norm;
  * qk_norm=True: norm_q and norm_k of every attention (blocks and token refiner) -> exactjit.rms_norm;
  * refiner_norms=True: the token refiner's norm1, norm2 and final_norm -> exactjit.rms_norm;
  * det_linear=True: time_embedder -> exactjit.timestep_mlp, every adaln_proj and norm_out's
    projection -> exactjit.adaln_projection. These are NOT bitwise equal to cuBLAS (another, fixed
    summation order: batch-invariant and repeatable instead; docs/det_linear.md), hence opt-in.

Without det_linear the patched model is bitwise equal to the unpatched one: each kernel equals the
eager expression it replaces bit for bit, and an input a kernel does not take (not on CUDA, another
dtype, not contiguous or 4-element aligned, a table that is not a unit-stride view, under autocast,
...) makes the patched forward run the original expression for that call instead.

Before anything is patched, apply() checks every module it would touch and raises ValueError naming
the module and the rule it breaks, leaving the model as it was. The rules: the module classes are
diffusers' (subclasses only if they keep diffusers' forward); every RMSNorm involved normalizes one
last dimension that is a positive multiple of 4, in bfloat16, float16 or float32, with eps None or
finite and >= 0; time_proj has an even channel count; a module whose forward gets replaced has no
instance `forward` already (another patch, accelerate or diffusers hooks: apply exactjit first, or
remove those); a module whose work is fused away and never called (the blocks' norm1/norm2,
norm_out.norm, and with det_linear the projections' nn.Linear) has no hooks and is a plain torch
module (no LoRA wrapper); with det_linear the projections are bfloat16 nn.Linear with bias and the
timestep MLP float32 Linear-SiLU-Linear (the shipped checkpoint's layout).

sequence_parallel=True (a MiniMaxH3Transformer3DModel only; for training under diffusers' context
parallelism, `model.enable_parallelism(config=ContextParallelConfig(...))` called after apply): each
rank's forward is unchanged (the kernels are row-local: bitwise the rows one GPU computes), and the
backward runs the chain's table and weight gradients through exactjit.distributed, so every rank
ends with the whole gradient of each AdaLN table and norm weight, byte-equal to one GPU's
(docs/sequence-parallel.md), instead of its own rows' part. So do the parameters that only those
gradients reach: whole_gradient_parameters(model) lists them; a data-parallel reduction must leave
them out (summing P whole copies is not the gradient), while every other parameter keeps its
per-rank part as unpatched. The model's forward builds the plans from the unsplit timestep_indices
and token_tags once per layout (one host copy of the index; reusing the same index tensors skips
even the comparison). Without context parallelism, or without gradients, it changes nothing. Under
torch.compile the plan building and exactjit.distributed's ops run between graphs (graph breaks, so
not fullgraph=True), with the eager gradients' bits. An input the kernels do not take raises instead
of falling back, since the fallback's gradient would be one rank's part.

Applying twice with the same options does nothing; with other options it is refused (remove first).
An applied model can be compiled; apply and remove also take the compiled wrapper, and dynamo
recompiles after either. diffusers is imported by apply(), not by importing this module.
"""
import dataclasses
import functools
import math
import types

import torch
import torch.nn.functional as F

import exactjit as _xj
from ._context_parallel import ShardPlans, distributed_module

# Device types whose tensors the kernels take; on any other the original expressions run.
KERNEL_DEVICES = frozenset({"cuda"})
# What apply() keeps on the module it patched: a Patch (plain attribute: not in state_dict).
RECORD = "_exactjit_patch"

_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
_INDICES = (torch.int32, torch.int64)


@dataclasses.dataclass(frozen=True)
class Patch:
    """What apply() did: its options and every (path, module, function) whose bound method it set
    as module.forward. remove() deletes exactly these instance attributes."""
    options: tuple
    swaps: tuple = dataclasses.field(repr=False)


# ---------------------------------------------------------------------------------------------
# Which calls the kernels take. The library checks the same rules and would raise; checking them
# here instead lets the patched forward fall back to the original expression, so a patched model
# gives the unpatched one's bits for any input. Only metadata is read, so torch.compile traces it.

def _aligned(t):
    """t starts on a 4-element boundary, as the kernels need.

    NOTE: under torch.compile the storage offset of an intermediate is unknown while tracing (reading
    it breaks the graph), so it is not checked there: tensors made by ops start at 0, and the AdaLN
    chunks at multiples of H, which apply() checked to be a multiple of 4."""
    return torch.compiler.is_compiling() or t.storage_offset() % 4 == 0


def _rows_fit(x, hidden):
    """x can be a kernel's (..., S, H) operand."""
    return (x.device.type in KERNEL_DEVICES and x.dtype in _FLOATS and x.dim() >= 2 and x.shape[-1] == hidden
            and x.is_contiguous() and _aligned(x))


def _like(t, x):
    return t.device == x.device and t.dtype == x.dtype


def _table_fits(table, x):
    """table can be the (R, H) AdaLN table view paired with x: a chunk of the projection's output."""
    hidden = x.shape[-1]
    return (_like(table, x) and table.dim() == 2 and table.shape[1] == hidden and table.stride(1) == 1
            and table.stride(0) >= hidden and table.stride(0) % 4 == 0 and _aligned(table))


def _index_fits(index, x):
    return (index.device == x.device and index.dtype in _INDICES and index.dim() == 1 and index.is_contiguous()
            and index.shape[0] == x.shape[-2])


def _autocast(t):
    """Autocast is on for t's device."""
    return torch.is_autocast_enabled(t.device.type)


def _norm_fits(norm, x):
    """rms_norm takes x with this norm's weight; autocast would run the eager norm in float32."""
    return (_rows_fit(x, norm.normalized_shape[0]) and (norm.weight is None or _like(norm.weight, x))
            and not _autocast(x))


def _det_fits(temb, weight, dtype):
    """det_linear takes the float32 temb with `dtype` weights (bf16 projection, fp32 MLP)."""
    return (temb.device.type in KERNEL_DEVICES and temb.dtype == torch.float32 and temb.dim() == 2
            and weight.device == temb.device and weight.dtype == dtype and not _autocast(temb))


# ---------------------------------------------------------------------------------------------
# The swapped ops, each with the original expression as its fallback.

def _modulated_norm_fits(norm, x, shift, scale, index):
    return (_norm_fits(norm, x) and _table_fits(shift, x) and _table_fits(scale, x) and shift.shape == scale.shape
            and shift.stride() == scale.stride() and _index_fits(index, x))


def _gated_residual_fits(residual, gate, index, y):
    return (_rows_fit(residual, residual.shape[-1]) and residual.dim() <= 3 and y.shape == residual.shape
            and _like(y, residual) and y.is_contiguous() and _table_fits(gate, residual)
            and _index_fits(index, residual))


def _unsharded(what):
    """A sequence_parallel call the kernels cannot take: the fallback's gradients would be this
    rank's part only, so the whole-gradient contract is refused instead of broken."""
    return ValueError(f"exactjit.integrations.diffusers: sequence_parallel: {what} got inputs exactjit's kernels do "
                      "not take (CUDA, bf16/fp16/fp32, contiguous and 4-element aligned rows, no autocast), so its "
                      "gradients could not be made whole on every rank")


# `plan` (a SequencePlan over the index) is given under context parallelism with
# apply(sequence_parallel=True): the ops of exactjit.distributed then run on this rank's rows.

def _modulated_norm(norm, x, shift, scale, index, plan=None):
    """norm(x) * (1 + scale[index]) + shift[index], as the blocks and norm_out write it."""
    if _modulated_norm_fits(norm, x, shift, scale, index):
        if plan is not None:
            return distributed_module().rms_norm(x, norm.weight, norm.eps, plan, shift=shift, scale=scale)
        return _xj.rms_norm(x, norm.weight, norm.eps, shift=shift, scale=scale, index=index)
    if plan is not None:
        raise _unsharded("a modulated RMSNorm")
    return norm(x) * (1.0 + scale.index_select(0, index)) + shift.index_select(0, index)


def _gated_residual(residual, gate, index, y, plan=None):
    """residual + gate[index] * y, as the blocks write it."""
    if _gated_residual_fits(residual, gate, index, y):
        if plan is not None:
            return distributed_module().gate_residual(residual, gate, y, plan)
        return _xj.gate_residual(residual, gate, index, y)
    if plan is not None:
        raise _unsharded("a gated residual")
    return residual + gate.index_select(0, index) * y


def _gated_residual_norm(residual, gate, index, y, norm, shift, scale, plan=None):
    """(h, _modulated_norm(norm, h, shift, scale, index)) for h = _gated_residual(residual, gate, index, y),
    in one kernel where both would take theirs and the gate shares shift's rows and row stride.

    NOTE: residual stands in for h in the norm's checks: h would be a new tensor of its shape, dtype
    and device, contiguous and at offset 0, which the gated residual's checks already ask of residual."""
    if (_gated_residual_fits(residual, gate, index, y) and _modulated_norm_fits(norm, residual, shift, scale, index)
            and gate.shape == shift.shape and gate.stride() == shift.stride()):
        if plan is not None:
            return distributed_module().gate_residual_rms_norm(residual, gate, y, norm.weight, norm.eps, plan,
                                                               shift=shift, scale=scale)
        return _xj.gate_residual_rms_norm(residual, gate, index, y, norm.weight, norm.eps, shift=shift, scale=scale)
    h = _gated_residual(residual, gate, index, y, plan)
    return h, _modulated_norm(norm, h, shift, scale, index, plan)


def _parameter_dtype(module):
    """diffusers' get_parameter_dtype, which the original forwards use (diffusers is loaded by then)."""
    from diffusers.models.modeling_utils import get_parameter_dtype
    return get_parameter_dtype(module)


def _adaln_table(linear, temb, det_linear):
    """linear(silu(temb) cast to the projection's dtype), as the AdaLN modules write it; with
    det_linear exactjit.adaln_projection, the same expression in a fixed order."""
    if det_linear and _det_fits(temb, linear.weight, torch.bfloat16):
        return _xj.adaln_projection(temb, linear.weight, linear.bias)
    return linear(F.silu(temb).to(_parameter_dtype(linear)))


# ---------------------------------------------------------------------------------------------
# The forwards apply() binds to instances. Each mirrors diffusers 0.42.1's forward of that class
# line by line, with the swapped ops in place of the expressions they equal.

# With sequence_parallel, the model's, the blocks' and norm_out's forwards are bound with `shards`,
# the model's ShardPlans (_context_parallel.py).

def _block_forward(self, hidden_states, temb, adaln_indices, rotary_emb, attention_mask=None, *, shards=None):
    """MiniMaxH3TransformerBlock.forward."""
    plan = None if shards is None else shards.plan("adaln", adaln_indices, "a MiniMaxH3TransformerBlock")
    if plan is not None:  # block 0 gets diffusers' split as a view, strided where the batch is > 1
        hidden_states = hidden_states.contiguous()
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaln_proj(temb)

    residual = hidden_states
    norm_hidden_states = _modulated_norm(self.norm1, hidden_states, shift_msa, scale_msa, adaln_indices, plan)
    attn_output = self.attn(norm_hidden_states, rotary_emb, attention_mask)
    hidden_states, norm_hidden_states = _gated_residual_norm(residual, gate_msa, adaln_indices, attn_output,
                                                             self.norm2, shift_mlp, scale_mlp, plan)

    residual = hidden_states
    ff_output = self.ff(norm_hidden_states)
    return _gated_residual(residual, gate_mlp, adaln_indices, ff_output, plan)


def _norm_out_forward(self, hidden_states, temb, timestep_indices, *, det_linear=False, shards=None):
    """MiniMaxH3AdaLayerNormOut.forward (with det_linear, its projection on exactjit.adaln_projection)."""
    plan = None if shards is None else shards.plan("timesteps", timestep_indices, "norm_out")
    shift, scale = _adaln_table(self.linear, temb, det_linear).chunk(2, dim=-1)
    return _modulated_norm(self.norm, hidden_states, shift, scale, timestep_indices, plan)


def _norm_out_forward_det_linear(self, hidden_states, temb, timestep_indices, *, shards=None):
    """MiniMaxH3AdaLayerNormOut.forward, its projection on exactjit.adaln_projection."""
    return _norm_out_forward(self, hidden_states, temb, timestep_indices, det_linear=True, shards=shards)


def _model_forward(self, *args, shards, **kwargs):
    """MiniMaxH3Transformer3DModel.forward, after the plans of its layout are ready (sequence_parallel)."""
    shards.prepare(self, args, kwargs)
    return type(self).forward(self, *args, **kwargs)


def _modulation_forward_det_linear(self, temb):
    """MiniMaxH3AdaLayerNormModulation.forward on exactjit.adaln_projection."""
    return _adaln_table(self.linear, temb, True).view(-1, 6 * self.hidden_size).chunk(6, dim=-1)


def _time_embedder_forward_det_linear(self, sample, condition=None):
    """TimestepEmbedding.forward (Linear, SiLU, Linear) on exactjit.timestep_mlp."""
    l1, l2 = self.linear_1, self.linear_2
    if condition is None and _det_fits(sample, l1.weight, torch.float32) and _like(l2.weight, l1.weight):
        return _xj.timestep_mlp(sample, l1.weight, l1.bias, l2.weight, l2.bias)
    return type(self).forward(self, sample, condition)


def _timesteps_forward(self, timesteps):
    """diffusers' Timesteps.forward (get_timestep_embedding, its default max_period 10000)."""
    if timesteps.device.type in KERNEL_DEVICES and timesteps.dim() == 1:
        return _xj.timestep_sinusoid(timesteps, self.num_channels, max_period=10000,
                                     flip_sin_to_cos=self.flip_sin_to_cos,
                                     downscale_freq_shift=self.downscale_freq_shift, scale=self.scale)
    return type(self).forward(self, timesteps)


def _rms_norm_forward(self, x):
    """torch.nn.RMSNorm.forward (qk and token-refiner norms)."""
    if _norm_fits(self, x):
        return _xj.rms_norm(x, self.weight, self.eps)
    return type(self).forward(self, x)


# ---------------------------------------------------------------------------------------------
# Validation and planning: every rule is checked before the first forward is set.

def _sub(path, name):
    return f"{path}.{name}" if path else name


def _refusal(path, rule):
    return ValueError(f"exactjit.integrations.diffusers.apply: {path or 'the model'}: {rule}; nothing was patched")


def _hooks(module):
    return (len(module._forward_hooks) + len(module._forward_pre_hooks) + len(module._backward_hooks)
            + len(module._backward_pre_hooks))


class _Plan:
    """The swaps of one apply(), collected while the rules are checked."""

    def __init__(self, h3, options):
        self.h3 = h3
        self.options = options
        self.swaps = []
        self.shards = (ShardPlans(h3.MiniMaxH3Transformer3DModel, h3.MINIMAX_H3_MODALITY_NUM)
                       if options["sequence_parallel"] else None)

    def sharded(self, function):
        """function, bound to this apply's ShardPlans where sequence_parallel is on.

        NOTE: a closure, not functools.partial: dynamo cannot trace a module whose forward is a
        method over a partial (trace_rules looks for the function's source file)."""
        if self.shards is None:
            return function
        shards = self.shards

        @functools.wraps(function)
        def forward(module, *args, **kwargs):
            return function(module, *args, shards=shards, **kwargs)
        return forward

    def add(self, path, module, function):
        """module.forward will become `function` bound to module."""
        if "forward" in module.__dict__:
            raise _refusal(path, f"already has an instance forward ({module.__dict__['forward']!r}): patched by "
                                 "exactjit or wrapped by a hook (accelerate, diffusers hooks); apply exactjit first, "
                                 "or remove that first")
        self.swaps.append((path, module, function))

    @staticmethod
    def check_class(path, module, cls):
        if not isinstance(module, cls):
            raise _refusal(path, f"is a {type(module).__qualname__}, expected {cls.__module__}.{cls.__qualname__}")
        if type(module).forward is not cls.forward:
            raise _refusal(path, f"{type(module).__qualname__} overrides forward; exactjit reproduces "
                                 f"{cls.__module__}.{cls.__qualname__}.forward only")

    @staticmethod
    def check_fused_away(path, module, into):
        """module will not be called any more (its work is done inside `into`)."""
        if _hooks(module) or "forward" in module.__dict__:
            raise _refusal(path, f"has hooks or an instance forward that would no longer run: exactjit fuses it into "
                                 f"{into}; remove them first")

    def check_rms_norm(self, path, norm):
        """A torch.nn.RMSNorm the kernels take; its hidden size."""
        self.check_class(path, norm, torch.nn.RMSNorm)
        if len(norm.normalized_shape) != 1:
            raise _refusal(path, f"normalizes the last {len(norm.normalized_shape)} dimensions; exactjit.rms_norm "
                                 "normalizes the last one only")
        hidden = norm.normalized_shape[0]
        if hidden < 4 or hidden % 4:
            raise _refusal(path, f"size {hidden} is not a positive multiple of 4 (exactjit.rms_norm reproduces "
                                 "PyTorch's vectorized RMSNorm, which needs H % 4 == 0)")
        if norm.weight is not None and norm.weight.dtype not in _FLOATS:
            raise _refusal(path, f"weight is {norm.weight.dtype}; exactjit.rms_norm takes bfloat16, float16 or float32")
        if norm.eps is not None and not (math.isfinite(norm.eps) and norm.eps >= 0):
            raise _refusal(path, f"eps {norm.eps} is not finite and >= 0")
        return hidden

    def check_linear(self, path, linear, dtype, into):
        """An nn.Linear with bias whose weight det_linear reads directly."""
        self.check_class(path, linear, torch.nn.Linear)
        self.check_fused_away(path, linear, into)
        if linear.bias is None or linear.weight.dtype != dtype or linear.bias.dtype != dtype:
            raise _refusal(path, f"det_linear needs a {dtype} weight and bias (got {linear.weight.dtype}, "
                                 f"{None if linear.bias is None else linear.bias.dtype})")

    def rms_norm(self, path, norm):
        self.check_rms_norm(path, norm)
        self.add(path, norm, _rms_norm_forward)

    def attention(self, path, attn):
        for name in ("norm_q", "norm_k"):
            self.rms_norm(_sub(path, name), getattr(attn, name))

    def block(self, path, block):
        self.check_class(path, block, self.h3.MiniMaxH3TransformerBlock)
        for name in ("norm1", "norm2"):
            self.check_rms_norm(_sub(path, name), getattr(block, name))
            into = "the modulated exactjit.rms_norm" if name == "norm1" else "exactjit.gate_residual_rms_norm"
            self.check_fused_away(_sub(path, name), getattr(block, name), into)
        self.add(path, block, self.sharded(_block_forward))
        if self.options["qk_norm"]:
            self.attention(_sub(path, "attn"), block.attn)
        if self.options["det_linear"]:
            self.check_class(_sub(path, "adaln_proj"), block.adaln_proj, self.h3.MiniMaxH3AdaLayerNormModulation)
            self.check_linear(_sub(path, "adaln_proj.linear"), block.adaln_proj.linear, torch.bfloat16,
                              "exactjit.adaln_projection")
            self.add(_sub(path, "adaln_proj"), block.adaln_proj, _modulation_forward_det_linear)

    def norm_out(self, path, norm_out):
        self.check_class(path, norm_out, self.h3.MiniMaxH3AdaLayerNormOut)
        self.check_rms_norm(_sub(path, "norm"), norm_out.norm)
        self.check_fused_away(_sub(path, "norm"), norm_out.norm, "the modulated exactjit.rms_norm")
        if self.options["det_linear"]:
            self.check_linear(_sub(path, "linear"), norm_out.linear, torch.bfloat16, "exactjit.adaln_projection")
            self.add(path, norm_out, self.sharded(_norm_out_forward_det_linear))
        else:
            self.add(path, norm_out, self.sharded(_norm_out_forward))

    def model(self, model):
        h3 = self.h3
        if self.shards is not None:
            self.add("", model, self.sharded(_model_forward))
        self.check_class("time_proj", model.time_proj, h3.Timesteps)
        channels = model.time_proj.num_channels
        if channels < 2 or channels % 2:
            raise _refusal("time_proj", f"{channels} channels; exactjit.timestep_sinusoid takes an even count >= 2")
        self.add("time_proj", model.time_proj, _timesteps_forward)
        if self.options["det_linear"]:
            embedder = model.time_embedder
            self.check_class("time_embedder", embedder, h3.TimestepEmbedding)
            if (embedder.cond_proj is not None or embedder.post_act is not None
                    or not isinstance(embedder.act, torch.nn.SiLU)):
                raise _refusal("time_embedder", "exactjit.timestep_mlp is Linear, SiLU, Linear (no cond_proj, no "
                                                "post_act)")
            for name in ("linear_1", "linear_2"):
                self.check_linear(f"time_embedder.{name}", getattr(embedder, name), torch.float32,
                                  "exactjit.timestep_mlp")
            self.add("time_embedder", embedder, _time_embedder_forward_det_linear)
        for i, block in enumerate(model.transformer_blocks):
            self.block(f"transformer_blocks.{i}", block)
        refiner = model.token_refiner
        for i, block in enumerate(refiner.refiner_blocks):
            path = f"token_refiner.refiner_blocks.{i}"
            if self.options["qk_norm"]:
                self.attention(_sub(path, "attn"), block.attn)
            if self.options["refiner_norms"]:
                self.rms_norm(_sub(path, "norm1"), block.norm1)
                self.rms_norm(_sub(path, "norm2"), block.norm2)
        if self.options["refiner_norms"]:
            self.rms_norm("token_refiner.final_norm", refiner.final_norm)
        self.norm_out("norm_out", model.norm_out)


def _unwrapped(model):
    """The module torch.compile wrapped (an OptimizedModule's _orig_mod), else model. Dynamo's
    guards see forwards set or deleted on it, so a compiled model recompiles after apply/remove."""
    return getattr(model, "_orig_mod", model)


def _import_h3():
    """diffusers' MiniMax-H3 module, with the embedding classes it uses."""
    try:
        from diffusers.models.transformers import transformer_minimax_h3 as h3
    except ImportError as e:
        raise ImportError(f"exactjit.integrations.diffusers needs diffusers with MiniMax-H3 (0.42): {e}") from e
    return h3


def apply(model, *, qk_norm=False, refiner_norms=False, det_linear=False, sequence_parallel=False):
    """Swaps the conditioning chain of `model` (a MiniMaxH3Transformer3DModel, a
    MiniMaxH3TransformerBlock or a MiniMaxH3AdaLayerNormOut) for exactjit's kernels; see the module
    doc. qk_norm and refiner_norms also swap those RMSNorms (bitwise equal too); det_linear swaps the
    timestep MLP and the AdaLN projections (not bitwise equal to cuBLAS; backward for T <= 8);
    sequence_parallel (a model only) makes the AdaLN and norm gradients whole under diffusers'
    context parallelism (see the module doc and whole_gradient_parameters).
    Also takes torch.compile's wrapper of such a module. Returns model. ValueError, with nothing
    patched, if a rule is broken or model was patched with other options."""
    target = _unwrapped(model)
    options = dict(qk_norm=bool(qk_norm), refiner_norms=bool(refiner_norms), det_linear=bool(det_linear),
                   sequence_parallel=bool(sequence_parallel))
    record = target.__dict__.get(RECORD)
    if record is not None:
        if record.options == tuple(options.items()):
            return model
        raise _refusal("", f"already patched with {dict(record.options)}; remove() it before applying {options}")
    h3 = _import_h3()
    plan = _Plan(h3, options)
    if isinstance(target, h3.MiniMaxH3Transformer3DModel):
        plan.model(target)
    else:
        if refiner_norms:
            raise _refusal("", "refiner_norms applies to a MiniMaxH3Transformer3DModel (it owns the token refiner)")
        if sequence_parallel:
            raise _refusal("", "sequence_parallel applies to a MiniMaxH3Transformer3DModel (its forward sees the "
                               "index before diffusers splits it)")
        if isinstance(target, h3.MiniMaxH3TransformerBlock):
            plan.block("", target)
        elif isinstance(target, h3.MiniMaxH3AdaLayerNormOut):
            if qk_norm:
                raise _refusal("", "qk_norm applies to a model or a block (norm_out has no attention)")
            plan.norm_out("", target)
        else:
            raise _refusal("", f"is a {type(target).__qualname__}; exactjit patches a MiniMaxH3Transformer3DModel, "
                               "a MiniMaxH3TransformerBlock or a MiniMaxH3AdaLayerNormOut")
    for _, module, function in plan.swaps:
        module.forward = types.MethodType(function, module)
    setattr(target, RECORD, Patch(tuple(options.items()), tuple(plan.swaps)))
    return model


def whole_gradient_parameters(model):
    """(name, parameter) of every parameter of a MiniMaxH3Transformer3DModel whose gradient is whole
    on every rank under context parallelism with apply(sequence_parallel=True): the timestep MLP,
    each block's AdaLN projection and norm1/norm2 weights, norm_out. A data-parallel gradient
    reduction over the context-parallel ranks must skip them."""
    h3 = _import_h3()
    target = _unwrapped(model)
    if not isinstance(target, h3.MiniMaxH3Transformer3DModel):
        raise ValueError(f"exactjit.integrations.diffusers.whole_gradient_parameters: expected a "
                         f"MiniMaxH3Transformer3DModel, got {type(target).__qualname__}")
    whole = ["time_embedder.", "norm_out."]
    for i in range(len(target.transformer_blocks)):
        whole += [f"transformer_blocks.{i}.adaln_proj.", f"transformer_blocks.{i}.norm1.",
                  f"transformer_blocks.{i}.norm2."]
    return [(name, p) for name, p in target.named_parameters() if name.startswith(tuple(whole))]


def remove(model):
    """Undoes apply(model): deletes exactly the instance forwards it set. ValueError, with nothing
    restored, if model was not patched by apply() or a patched forward was since replaced (e.g. by a
    hook added after apply: remove that first). Also takes torch.compile's wrapper. Returns model."""
    target = _unwrapped(model)
    record = target.__dict__.get(RECORD)
    if record is None:
        raise ValueError(f"exactjit.integrations.diffusers.remove: this {type(target).__qualname__} was not patched by "
                         "apply() (a module patched as part of a larger one is restored with it)")
    for path, module, function in record.swaps:
        current = module.__dict__.get("forward")
        if getattr(current, "__func__", None) is not function or getattr(current, "__self__", None) is not module:
            raise ValueError(f"exactjit.integrations.diffusers.remove: {path or 'the model'}: forward was replaced "
                             f"after apply ({current!r}); undo that first; nothing was restored")
    for _, module, _ in record.swaps:
        del module.forward
    delattr(target, RECORD)
    return model
