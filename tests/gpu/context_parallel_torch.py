#!/usr/bin/env python3
"""exactjit.integrations.diffusers under diffusers' context parallelism (issue 18 item 3), on the GPU machine.

--ranks processes form a torch.distributed group (--backend: default nccl where every rank has a GPU
of its own, else gloo, every rank on cuda:0; with gloo, diffusers' all-gather of the output rows goes
through the host, since gloo's all_gather_tensor crashes on CUDA tensors; its ulysses all-to-alls
run as they are). Each builds the same MiniMax-H3 transformer
(bench/minimax_h3_setup.py: H 5376, 56 heads x 128, 2 blocks, bf16 with the fp32 modules; random
weights, norm weights 1 + 0.1 randn) and the same packed sequence of --seq rows (T = 3), and patches it
with apply(sequence_parallel=True). The one-GPU reference is that model before parallelism is
enabled: its outputs, and its gradients for a fixed upstream gradient. Then
`enable_parallelism(ContextParallelConfig(ulysses_degree=ranks))` (diffusers' `_cp_plan` splits the
sequence before block 0; ulysses all-to-alls in attention), and:

  forward      (a) the outputs (video and audio velocities, gathered by diffusers) and norm_out's
               output rows of this rank are bitwise the one-GPU model's: under no_grad and with
               autograd (where exactjit.distributed's ops run). (b) The same model unpatched under
               context parallelism against unpatched on one GPU: whether diffusers' own split is
               bitwise (context for (a): our ops are row-local, so (a) holds exactly when (b) does).
  gradients    every parameter of whole_gradient_parameters (timestep MLP, AdaLN projections,
               norm1/norm2 weights, norm_out) is byte-equal to the one-GPU gradient on every rank.
               The other parameters hold this rank's part; their sum over the ranks is printed
               against the one-GPU gradient (rel-L2; not bitwise: a sum of parts is another order).
  control      patched without sequence_parallel (the same kernels, row-local), each rank holds
               its part of those parameters' gradients: the naive reduction (their sum over the
               ranks) must not give the one-GPU bits, or the comparison could not fail. Its forward
               rows are the one-GPU rows too.

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


def step(model, inputs, upstream, grad):
    """(outputs, norm_out's output, {name: gradient}) of one forward (+ backward with grad)."""
    seen = []
    handle = model.norm_out.register_forward_hook(lambda m, a, out: seen.append(out.detach()))
    try:
        if not grad:
            with torch.no_grad():
                return [o.detach() for o in model(**inputs)], seen[0], {}
        names, params = zip(*model.named_parameters())
        outputs = model(**inputs)
        grads = torch.autograd.grad(outputs, params, upstream, allow_unused=True)
        return [o.detach() for o in outputs], seen[0], dict(zip(names, grads))
    finally:
        handle.remove()


# Parameters outside whole_gradient_parameters, one per kind of place: before the split, attention,
# feed-forward, the token refiner (a few: each is summed over the ranks, through the host on gloo).
OTHERS = ("proj_in.weight", "transformer_blocks.0.attn.to_q.weight", "transformer_blocks.1.ff.net.2.weight",
          "token_refiner.final_norm.weight")


def summed(grad):
    """grad (this rank's part) summed over the ranks in fp32, on grad's device."""
    total = grad.float() if dist.get_backend() == "nccl" else grad.float().cpu()
    dist.all_reduce(total)
    return total.to(grad.device)


def rel_l2(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm())


def outputs_bitwise(got, want, rows):
    """(ok, detail) for gathered outputs and this rank's norm_out rows against the one-GPU run."""
    (video, audio, norm_rows), (ref_video, ref_audio, ref_norm) = got, want
    for name, g, w in (("video", video, ref_video), ("audio", audio, ref_audio),
                       ("norm_out rows", norm_rows, ref_norm[:, rows])):
        ok, detail = compare(g, w)
        if not ok:
            return False, f"{name}: {detail}"
    return True, "video, audio and this rank's norm_out rows bitwise equal"


def gather_through_host(tensor, gather_dim, group, tag=""):
    """funcol.all_gather_tensor for gloo: the ranks' tensors through the host, concatenated along
    gather_dim in rank order, back on tensor's device (copies, as the collective's). gloo's
    all-gather into one tensor crashes the process on CUDA tensors (torch 2.11: SIGSEGV in
    wait_tensor); diffusers gathers the output heads' rows with it."""
    host = tensor.detach().cpu()
    parts = [torch.empty_like(host) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, host, group=group)
    return torch.cat(parts, dim=gather_dim).to(tensor.device)


def worker(rank, world, args, init_file, result_file):
    device = join(rank, world, args.backend, init_file)
    if args.backend == "gloo":
        import torch.distributed._functional_collectives as funcol
        funcol.all_gather_tensor = gather_through_host
    import minimax_h3_setup as setup
    from diffusers import ContextParallelConfig

    from exactjit.integrations import diffusers as xjd
    results = []

    def check(group, quantity, ok, detail):
        results.append(dict(group=group, quantity=quantity, ok=bool(ok), detail=detail))

    def parallel(model):
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
        return model

    start = time.perf_counter()
    model = setup.build_model(torch.bfloat16, device=device)
    inputs = setup.packed_inputs(model, args.seq)
    rows = slice(rank * args.seq // world, (rank + 1) * args.seq // world)
    plain_one = step(model, inputs, None, False)
    upstream = setup.upstream(plain_one[0])
    xjd.apply(model, sequence_parallel=True)
    one_no_grad = step(model, inputs, None, False)
    one = step(model, inputs, upstream, True)
    whole = [name for name, _ in xjd.whole_gradient_parameters(model)]

    parallel(model)
    got = step(model, inputs, None, False)
    check("forward", "patched, no_grad: this rank == one GPU", *outputs_bitwise([*got[0], got[1]],
                                                                               [*one_no_grad[0], one_no_grad[1]], rows))
    got = step(model, inputs, upstream, True)
    check("forward", "patched, autograd: this rank == one GPU", *outputs_bitwise([*got[0], got[1]],
                                                                                [*one[0], one[1]], rows))
    for name in whole:
        ok, detail = compare(got[2][name], one[2][name])
        check("gradients", f"{name}: whole on this rank == one GPU", ok, detail)
    parts = {name: rel_l2(summed(got[2][name]), one[2][name]) for name in OTHERS}
    check("gradients", "other parameters: this rank's part, summed over ranks vs one GPU (rel-L2, printed)", True,
          ", ".join(f"{name} {value:.1e}" for name, value in parts.items()))
    del model, got

    parts_model = parallel(xjd.apply(setup.build_model(torch.bfloat16, device=device)))
    parts_got = step(parts_model, inputs, upstream, True)
    check("forward", "patched without sequence_parallel, autograd: this rank == one GPU",
          *outputs_bitwise([*parts_got[0], parts_got[1]], [*one[0], one[1]], rows))
    naive_equal = [compare(summed(parts_got[2][name]).to(one[2][name].dtype), one[2][name])[0] for name in whole]
    check("control", "without sequence_parallel (the same kernels, each rank's part): the parts summed over the "
          "ranks give the one-GPU bits for none of the whole-gradient parameters", not any(naive_equal),
          f"{sum(naive_equal)}/{len(whole)} equal")
    del parts_model, parts_got

    plain = parallel(setup.build_model(torch.bfloat16, device=device))
    plain_no_grad = step(plain, inputs, None, False)
    ok, detail = outputs_bitwise([*plain_no_grad[0], plain_no_grad[1]], [*plain_one[0], plain_one[1]], rows)
    check("forward", "unpatched, no_grad: this rank == one GPU (diffusers' own split; context, not a check)", True,
          ("bitwise: " if ok else "NOT bitwise: ") + detail)
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
