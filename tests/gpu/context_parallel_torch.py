#!/usr/bin/env python3
"""exactjit.integrations.diffusers under diffusers' context parallelism (issue 18 item 3), on the GPU machine.

--ranks processes form a torch.distributed group (--backend: default nccl where every rank has a GPU
of its own, else gloo, every rank on cuda:0; with gloo, diffusers' all-gather of the output rows goes
through the host, since gloo's all_gather_tensor crashes on CUDA tensors; its ulysses all-to-alls
run as they are). Each builds the same MiniMax-H3 transformer (bench/minimax_h3_setup.py: H 5376,
56 heads x 128, 2 blocks, bf16 with the fp32 modules; random weights, norm weights 1 + 0.1 randn)
and the same packed sequence of --seq rows (T = 3), and runs it under
`enable_parallelism(ContextParallelConfig(ulysses_degree=ranks))` (diffusers' `_cp_plan` splits the
sequence before block 0; ulysses all-to-alls in attention).

Checks (pass/fail):
  ops          Inside one forward + backward of the model patched with sequence_parallel, every
               call of an exactjit.distributed op (each block's norm1, fused norm2, second gated
               residual; norm_out) is recorded with its shard inputs and, through tensor hooks, the
               upstream gradients of its outputs and the gradients of its parameters. The ranks'
               shards are gathered and the one-GPU exactjit op runs on the whole rows with the whole
               upstream gradient: its output rows equal this rank's, and its table and weight
               gradients (d_gate, dshift, dscale, dweight) equal the whole ones this rank got, byte
               for byte.
  forward      The patched model's outputs under context parallelism are bitwise the unpatched
               model's under context parallelism (no_grad, and with autograd where the distributed
               ops run): exactjit changes no bit of diffusers' context-parallel model.
  control      Patched without sequence_parallel (the same kernels, each rank its part of the
               table and weight gradients): summing the parts over the ranks does not give the
               whole gradients the sequence_parallel run gives, or the ops check could not fail.
Context (reported, not checks: they measure diffusers and cuBLAS, not exactjit):
  one GPU      The context-parallel outputs and the whole_gradient_parameters gradients against
               the same model on one GPU; and whether cuBLAS gives a GEMM's first half of rows the
               same bits as the whole GEMM's (the sharded projections' M is S / ranks).

Usage: python3 tests/gpu/context_parallel_torch.py [--ranks 2] [--seq 4098] [--backend auto]
    [--report cp.md] [--json cp.json]
The sequence must split evenly (diffusers' equal split; its uneven mode gathers unequal sizes, which
gloo refuses). Exit status: 0 every check passes, 1 a check failed, 2 CUDA, diffusers or
torch.distributed unavailable.
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before torch initialises cuBLAS

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "bench"))  # minimax_h3_setup.py
sys.path.insert(0, HERE)
from check_support import compare  # noqa: E402
from rank_runs import join, leave, report, run_worlds  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "tests", "python"))
from distributed_calls import Recorder, all_bitwise, call_checks, gather_through_host  # noqa: E402


def step(model, inputs, upstream, grad):
    """(outputs, {name: gradient}) of one forward (+ backward with grad)."""
    if not grad:
        with torch.no_grad():
            return [o.detach() for o in model(**inputs)], {}
    names, params = zip(*model.named_parameters())
    outputs = model(**inputs)
    grads = torch.autograd.grad(outputs, params, upstream, allow_unused=True)
    return [o.detach() for o in outputs], dict(zip(names, grads))


def summed(grad):
    """grad (this rank's part) summed over the ranks in fp32, on grad's device."""
    total = grad.float() if dist.get_backend() == "nccl" else grad.float().cpu()
    dist.all_reduce(total)
    return total.to(grad.device)


def one_gpu_op(xj):
    """The one-GPU exactjit op for distributed_calls.replay_whole."""
    def run(op, leaves, eps, plan):
        if op == "rms_norm":
            modulated = "scale" in leaves
            return (xj.rms_norm(leaves["x"], leaves["weight"], eps, shift=leaves.get("shift"),
                                scale=leaves.get("scale"), index=plan.keys if modulated else None),)
        if op == "gate_residual_rms_norm":
            return xj.gate_residual_rms_norm(leaves["residual"], leaves["gate"], plan.keys, leaves["y"],
                                             leaves["weight"], eps, shift=leaves.get("shift"),
                                             scale=leaves.get("scale"))
        return (xj.gate_residual(leaves["residual"], leaves["gate"], plan.keys, leaves["y"]),)
    return run


def gemm_rows_context(device):
    """Whether cuBLAS gives the first half of a GEMM's rows the bits of the whole GEMM (the
    projections of a sharded sequence run with M = S / ranks)."""
    gen = torch.Generator(device=device).manual_seed(3)
    x = torch.randn(4098, 5376, generator=gen, device=device, dtype=torch.bfloat16)
    w = torch.randn(5376, 5376, generator=gen, device=device, dtype=torch.bfloat16) * 0.02
    ok, detail = compare(torch.nn.functional.linear(x[:2049], w), torch.nn.functional.linear(x, w)[:2049])
    return ("bitwise: " if ok else "NOT bitwise: ") + detail


def worker(rank, world, args, init_file, result_file):
    device = join(rank, world, args.backend, init_file)
    if args.backend == "gloo":
        import torch.distributed._functional_collectives as funcol
        funcol.all_gather_tensor = gather_through_host
    import minimax_h3_setup as setup
    from diffusers import ContextParallelConfig

    import exactjit as xj
    from exactjit import distributed as xd
    from exactjit.integrations import diffusers as xjd
    results = []

    def record(group, quantity, ok, detail):
        results.append(dict(group=group, quantity=quantity, ok=bool(ok), detail=detail))

    def build(**options):
        return xjd.apply(setup.build_model(torch.bfloat16, device=device), **options)

    def parallel(model):
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
        return model

    start = time.perf_counter()
    model = build(sequence_parallel=True)
    inputs = setup.packed_inputs(model, args.seq)
    one_no_grad = step(model, inputs, None, False)
    upstream = setup.upstream(one_no_grad[0])
    one = step(model, inputs, upstream, True)
    whole = [name for name, _ in xjd.whole_gradient_parameters(model)]

    parallel(model)
    group = model._parallel_config.context_parallel_config._flattened_mesh.get_group()
    patched_no_grad = step(model, inputs, None, False)
    with Recorder(xd) as recorder:
        patched = step(model, inputs, upstream, True)
    for quantity, ok, detail in call_checks(recorder, rank, group, one_gpu_op(xj), compare):
        record("ops", quantity, ok, detail)
    if len(recorder.calls) != 3 * model.config.num_layers + 1:
        record("ops", "every swapped op ran through exactjit.distributed", False,
               f"{len(recorder.calls)} calls, want {3 * model.config.num_layers + 1}")
    del model

    plain = parallel(setup.build_model(torch.bfloat16, device=device))
    plain_no_grad = step(plain, inputs, None, False)
    plain_grad = step(plain, inputs, upstream, True)
    for label, got, want in (("no_grad", patched_no_grad, plain_no_grad), ("autograd", patched, plain_grad)):
        record("forward", f"patched == unpatched under context parallelism, {label}",
               *all_bitwise(list(zip(("video", "audio"), got[0], want[0])), compare))
    del plain, plain_grad

    parts_model = parallel(build())
    parts = step(parts_model, inputs, upstream, True)
    naive_equal = [compare(summed(parts[1][name]).to(patched[1][name].dtype), patched[1][name])[0] for name in whole]
    record("control", "without sequence_parallel: the ranks' parts summed give the whole gradients for none of "
           "the whole-gradient parameters", not any(naive_equal), f"{sum(naive_equal)}/{len(whole)} equal")
    del parts_model, parts

    same = all_bitwise(list(zip(("video", "audio"), patched[0], one[0])), compare)
    record("context", "outputs under context parallelism == one GPU (diffusers' split)", True,
           ("bitwise: " if same[0] else "NOT bitwise: ") + same[1])
    differing = [name for name in whole if not compare(patched[1][name], one[1][name])[0]]
    record("context", "whole_gradient_parameters under context parallelism == one GPU", True,
           f"{len(whole) - len(differing)}/{len(whole)} bitwise equal" +
           (f" (differ: {', '.join(differing[:3])}{', ...' if len(differing) > 3 else ''})" if differing else ""))
    record("context", "cuBLAS: rows 0..2048 of x @ W.T (4098 x 5376 x 5376 bf16) == the same rows of the whole GEMM",
           True, gemm_rows_context(device))
    print(f"rank {rank}: {time.perf_counter() - start:.1f} s", flush=True)
    leave(world, results, result_file)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4098)
    parser.add_argument("--backend", default="auto", help="nccl, gloo, or auto (nccl with a GPU per rank)")
    parser.add_argument("--report")
    parser.add_argument("--json")
    args = parser.parse_args()
    if not torch.cuda.is_available() or not dist.is_available() or importlib.util.find_spec("diffusers") is None:
        print("context_parallel_torch: needs CUDA, torch.distributed and diffusers", file=sys.stderr)
        return 2
    if args.seq % args.ranks:
        parser.error(f"--seq {args.seq} must be a multiple of --ranks {args.ranks} (diffusers' equal split)")
    if args.backend == "auto":
        args.backend = "nccl" if torch.cuda.device_count() >= args.ranks else "gloo"
    meta = dict(device=torch.cuda.get_device_name(), devices=torch.cuda.device_count(), backend=args.backend,
                torch=torch.__version__, commit=os.environ.get("EXACTJIT_COMMIT", "unknown"), seq=args.seq,
                ranks=args.ranks)
    rows = run_worlds(worker, [args.ranks], args)
    return report("context_parallel_torch", "exactjit under diffusers' context parallelism (ulysses) against one GPU",
                  "Every rank checks its own rows and the whole gradients it ends with.", ("group", "quantity"), rows,
                  meta, args)


if __name__ == "__main__":
    sys.exit(main())
