"""apply(sequence_parallel=True) under diffusers' context parallelism: the SequencePlans that make
the AdaLN tables' and the norms' gradients whole on every rank, byte-equal to one GPU's.

diffusers' `_cp_plan` for MiniMax-H3 splits the packed sequence before block 0 and hands every block
(and norm_out) its rank's slice of the row index; a block never sees the whole index, which a plan
needs (docs/sequence-parallel.md). So the patched model's forward builds the plans from its own
`timestep_indices` and `token_tags` (the unsplit tensors) before the split, with the shard sizes
diffusers' sharder gives each rank, and the blocks look them up.
"""
import inspect

import torch


def shard_sizes(seq, ranks, uneven):
    """The rows of each rank's slice of a (seq,)-long axis as diffusers' sharders cut it: equal parts
    (EquipartitionSharder, which asserts divisibility), or torch.tensor_split's, the first seq % ranks
    one row longer (PartitionAnythingSharder, with ulysses_anything or ring_anything)."""
    if not uneven and seq % ranks:
        raise ValueError(f"exactjit.integrations.diffusers: sequence length {seq} is not divisible by the "
                         f"{ranks} context-parallel ranks (diffusers' equal split needs it; set ulysses_anything)")
    small, extra = divmod(seq, ranks)
    return [small + (r < extra) for r in range(ranks)]


class ShardPlans:
    """Per patched model: the plans of the layout its forwards run, rebuilt when the layout changes.

    prepare() runs at the start of each model forward; `active` is then the plans of this forward's
    layout ("adaln": the blocks' index timestep_indices * modalities + token_tags over 3T table rows;
    "timesteps": norm_out's timestep_indices over T rows), or None where the model runs without
    context parallelism or without gradients (the kernels' rows are row-local, so a forward alone
    needs no plan). It stays set after the forward, so an activation-checkpointed block's
    recomputation in the backward finds it."""

    def __init__(self, model_class, modalities):
        self._signature = inspect.signature(model_class.forward)
        self._modalities = modalities
        self._layout = None  # (key, timestep_indices, token_tags, plans) of the last layout built
        self.active = None

    def prepare(self, model, args, kwargs):
        config = getattr(model, "_parallel_config", None)
        cp = None if config is None else config.context_parallel_config
        if cp is None or not torch.is_grad_enabled():
            self.active = None
            return
        bound = self._signature.bind(model, *args, **kwargs).arguments
        steps, tags = bound["timestep_indices"], bound["token_tags"]
        latents, timestep = bound["hidden_states"], bound["timestep"]
        mesh = cp._flattened_mesh
        sizes = shard_sizes(steps.shape[0], mesh.size(), cp.ulysses_anything or cp.ring_anything)
        key = (tuple(sizes), latents.shape[0], timestep.shape[0], mesh.get_group(), latents.device)
        self.active = self._plans(key, steps, tags)

    def _plans(self, key, steps, tags):
        """The layout's plans: the last ones if key and the index tensors match (the same tensors
        unchanged, else equal values: one comparison on the device), else new ones."""
        if self._layout is not None and self._layout[0] == key:
            _, old_steps, old_tags, plans = self._layout
            same = (steps is old_steps[0] and steps._version == old_steps[1] and tags is old_tags[0]
                    and tags._version == old_tags[1])
            if same or (torch.equal(steps, old_steps[0]) and torch.equal(tags, old_tags[0])):
                self._layout = (key, (steps, steps._version), (tags, tags._version), plans)
                return plans
        distributed = distributed_module()
        sizes, batch, timesteps, group, device = key
        adaln = steps * self._modalities + tags
        plans = dict(adaln=distributed.SequencePlan(adaln, self._modalities * timesteps, sizes, batch=batch,
                                                    group=group, device=device),
                     timesteps=distributed.SequencePlan(steps, timesteps, sizes, batch=batch, group=group,
                                                        device=device))
        self._layout = (key, (steps, steps._version), (tags, tags._version), plans)
        return plans

    def plan(self, name, local_index, where):
        """The plan `name` for a module given this rank's slice of its index, or None (no context
        parallelism, or no gradient to make whole)."""
        if self.active is None or not torch.is_grad_enabled():
            return None
        plan = self.active[name]
        if local_index.shape[0] != plan.size:
            raise ValueError(f"exactjit.integrations.diffusers: {where} got {local_index.shape[0]} index rows on rank "
                             f"{plan.rank}, the plan expects {plan.size}: the sequence was not split as diffusers' "
                             "_cp_plan splits it")
        return plan


def distributed_module():
    """exactjit.distributed (it imports torch.distributed: loaded on first use)."""
    from .. import distributed
    return distributed
