"""exactjit.distributed's calls inside a model, recorded and replayed on the whole rows: what the
context-parallel checks (tests/python/test_context_parallel_cpu.py, tests/gpu/context_parallel_torch.py)
share. Each recorded call's shards are gathered from the ranks and the one-GPU op runs on the whole
rows with the whole upstream gradient; its output rows must be this rank's and its table and weight
gradients the whole ones this rank got, byte for byte."""
import torch
import torch.distributed as dist

# What each exactjit.distributed op takes: its positional arguments, its shard inputs, its
# parameters (whose gradients are whole on every rank) and the names of its outputs. The inputs'
# gradients are not compared: a hook on an input sees the sum over all its uses (a block's input
# feeds norm1 and the residual).
SIGNATURES = {
    "rms_norm": (("x", "weight", "eps", "plan"), ("x",), ("weight", "shift", "scale"), ("out",)),
    "gate_residual_rms_norm": (("residual", "gate", "y", "weight", "eps", "plan"), ("residual", "y"),
                               ("gate", "weight", "shift", "scale"), ("h", "out")),
    "gate_residual": (("residual", "gate", "y", "plan"), ("residual", "y"), ("gate",), ("out",)),
}


class Recorder:
    """Wraps exactjit.distributed's ops (the diffusers integration looks them up at each call):
    keeps each call's arguments and outputs, and hooks its parameters and outputs (each used once)
    to keep the gradient the backward gives it."""

    def __init__(self, xd):
        self.xd, self.calls, self.handles = xd, [], []

    def __enter__(self):
        self.saved = {op: getattr(self.xd, op) for op in SIGNATURES}
        for op, fn in self.saved.items():
            setattr(self.xd, op, self._wrap(op, fn))
        return self

    def __exit__(self, *exc):
        for op, fn in self.saved.items():
            setattr(self.xd, op, fn)
        for handle in self.handles:
            handle.remove()

    def _keep(self, call, name, tensor):
        if tensor is not None and tensor.requires_grad:
            self.handles.append(tensor.register_hook(lambda g: call["grads"].__setitem__(name, g)))

    def _wrap(self, op, fn):
        positional, _, params, outputs = SIGNATURES[op]

        def wrapped(*args, **kwargs):
            named = dict(zip(positional, args), **kwargs)
            out = fn(*args, **kwargs)
            outs = out if isinstance(out, tuple) else (out,)
            call = dict(op=op, args=named, outputs=dict(zip(outputs, (o.detach() for o in outs))), grads={})
            for name in params:
                self._keep(call, name, named.get(name))
            for name, tensor in zip(outputs, outs):
                self._keep(call, "d_" + name, tensor)
            self.calls.append(call)
            return out
        return wrapped


def gather_through_host(tensor, gather_dim, group, tag=""):
    """Every rank's tensor (equal shapes) concatenated along gather_dim in rank order, through the
    host (gloo takes CPU tensors), back on tensor's device: copies only. Also serves as
    funcol.all_gather_tensor on gloo, whose all-gather into one tensor crashes the process on CUDA
    tensors (torch 2.11: SIGSEGV in wait_tensor)."""
    host = tensor.detach().contiguous().cpu()
    parts = [torch.empty_like(host) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, host, group=group)
    return torch.cat(parts, dim=gather_dim).to(tensor.device)


def gathered_rows(tensor, group):
    """The whole (B, S, H) from every rank's (B, S_r, H) rows (equal shards)."""
    return gather_through_host(tensor, 1, group)


def replay_whole(call, one_gpu, group):
    """The call's op on the gathered rows with the gathered upstream gradients, through
    one_gpu(op, leaves, eps, plan) -> outputs tuple: ({output: whole rows}, {parameter: gradient})."""
    op, args = call["op"], call["args"]
    _, inputs, params, outputs = SIGNATURES[op]
    leaves = {name: gathered_rows(args[name], group) for name in inputs}
    names = [name for name in params if args.get(name) is not None]
    leaves.update({name: args[name].detach().clone().requires_grad_() for name in names})
    outs = one_gpu(op, leaves, args["eps"] if "eps" in args else None, args["plan"])
    upstream = [gathered_rows(call["grads"]["d_" + name], group) for name in outputs]
    grads = torch.autograd.grad(outs, [leaves[n] for n in names], upstream)
    return dict(zip(outputs, (o.detach() for o in outs))), dict(zip(names, grads))


def call_checks(recorder, rank, group, one_gpu, compare):
    """(quantity, ok, detail) per recorded call: this rank's output rows and whole gradients against
    one_gpu's on the gathered rows; compare(got, want) -> (ok, detail) compares bit patterns."""
    checks, seen = [], {}
    for call in recorder.calls:
        op = call["op"]
        seen[op] = seen.get(op, 0) + 1
        want_out, want_grads = replay_whole(call, one_gpu, group)
        outputs = SIGNATURES[op][3]
        size = call["outputs"][outputs[0]].shape[1]
        rows = slice(rank * size, (rank + 1) * size)
        pairs = [(name, call["outputs"][name], want_out[name][:, rows]) for name in outputs]
        pairs += [("d_" + name, call["grads"][name], want_grads[name]) for name in want_grads]
        checks.append((f"{op} call {seen[op]}: output rows and whole gradients == the one-GPU op",
                       *all_bitwise(pairs, compare)))
    return checks


def all_bitwise(pairs, compare):
    """(ok, detail) over (name, got, want) triples with compare(got, want) -> (ok, detail): the
    first difference, else all equal."""
    for name, got, want in pairs:
        ok, detail = compare(got, want)
        if not ok:
            return False, f"{name}: {detail}"
    return True, f"{', '.join(name for name, _, _ in pairs)} bitwise equal"
