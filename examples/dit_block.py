#!/usr/bin/env python3
"""One DiT block's conditioning chain on exactjit, with autograd and a CUDA graph.

The chain of an AdaLN-modulated diffusion-transformer block (MiniMax-H3's, at a smaller size):

    timestep t -> sinusoid (256) -> timestep MLP (fp32) -> AdaLN projection -> table (T, 18H) bf16
    table as rows (3T, 6H): shift, scale, gate for attention and for the MLP, picked per token
    x -> rms_norm modulated -> attention stand-in -> gate_residual
      -> rms_norm modulated -> MLP stand-in       -> gate_residual -> out

(The stand-ins for attention and the feed-forward are elementwise, tanh(n) * w, so the checks below
need no assumption about a GEMM library's determinism.)

It checks, and exits 1 at the first failure:
  1. the block ops are bitwise equal to eager PyTorch given the same table;
  2. forward + backward (autograd into x, every weight and the timestep MLP) is repeatable bit for bit;
  3. forward + backward captured in one CUDA graph and replayed equal the eager-mode results, bit for
     bit. Capture needs one eager call first (the warm-up): it compiles or loads the kernels, which
     NVRTC and module loading cannot do inside a capture.

    python3 examples/dit_block.py      # GPU machine; without CUDA (or torch) it says so and exits 0

Uses the installed exactjit (pip install .), else this checkout's python/ and build/.
"""
import os
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("dit_block: torch is not installed; skipping")
    sys.exit(0)
if not torch.cuda.is_available():
    print("dit_block: CUDA is not available; skipping (this example runs on a GPU machine)")
    sys.exit(0)

try:
    import exactjit
except ImportError:  # not installed: the checkout's package, which finds build/libexactjit.so
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import exactjit

H = 1024          # hidden size (H3: 5376)
D = 512           # time-embedding width (H3: 2688)
CHANNELS = 256    # sinusoid channels
T, B, S = 2, 2, 64  # timesteps, batch, tokens
EPS = 1e-5


def fail(message):
    print(f"dit_block: FAILED: {message}")
    sys.exit(1)


def make_inputs():
    """Parameters and inputs on the GPU; the ones autograd differentiates require grad."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype).requires_grad_()

    return {
        "t": torch.rand(T, generator=g, device="cuda"),
        "w1": randn(D, CHANNELS, dtype=torch.float32, scale=CHANNELS ** -0.5),
        "b1": randn(D, dtype=torch.float32, scale=0.1),
        "w2": randn(D, D, dtype=torch.float32, scale=D ** -0.5),
        "b2": randn(D, dtype=torch.float32, scale=0.1),
        "w_ada": randn(18 * H, D, scale=D ** -0.5),
        "b_ada": randn(18 * H, scale=0.1),
        "norm1": randn(H, scale=0.1),
        "norm2": randn(H, scale=0.1),
        "attn": randn(H),  # stands in for attention
        "mlp": randn(H),   # stands in for the feed-forward
        "x": randn(B, S, H),
        "index": (torch.randint(0, T, (S,), generator=g, device="cuda") * 3 +
                  torch.randint(0, 3, (S,), generator=g, device="cuda")),
        "upstream": torch.randn(B, S, H, generator=g, device="cuda"),
    }


def adaln_table(p):
    """(3T, 6H) rows of the block's AdaLN table, from the timesteps."""
    features = exactjit.timestep_sinusoid(p["t"] * 1000, CHANNELS)
    temb = exactjit.timestep_mlp(features, p["w1"], p["b1"], p["w2"], p["b2"])
    return exactjit.adaln_projection(temb, p["w_ada"], p["b_ada"]).view(3 * T, 6 * H)


def block(p, rows):
    """The block on exactjit: modulated norms and gated residuals read the table through views."""
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = rows.chunk(6, dim=-1)
    i, x = p["index"], p["x"]
    n = exactjit.rms_norm(x, p["norm1"], EPS, shift=shift_msa, scale=scale_msa, index=i)
    x = exactjit.gate_residual(x, gate_msa, i, torch.tanh(n) * p["attn"])
    n = exactjit.rms_norm(x, p["norm2"], EPS, shift=shift_mlp, scale=scale_mlp, index=i)
    return exactjit.gate_residual(x, gate_mlp, i, torch.tanh(n) * p["mlp"])


def eager_block(p, rows):
    """The same block in eager PyTorch (the contract exactjit's forward is bitwise equal to)."""
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = rows.chunk(6, dim=-1)
    i, x = p["index"], p["x"]

    def modulated(x, weight, shift, scale):
        return F.rms_norm(x, (H,), weight, EPS) * (1 + scale.index_select(0, i)) + shift.index_select(0, i)

    x = x + gate_msa.index_select(0, i) * (torch.tanh(modulated(x, p["norm1"], shift_msa, scale_msa)) * p["attn"])
    return x + gate_mlp.index_select(0, i) * (torch.tanh(modulated(x, p["norm2"], shift_mlp, scale_mlp)) * p["mlp"])


GRAD_NAMES = ("x", "w1", "b1", "w2", "b2", "w_ada", "b_ada", "norm1", "norm2", "attn", "mlp")


def step(p):
    """Forward and backward of the whole chain: the block's output and every gradient."""
    out = block(p, adaln_table(p))
    loss = (out.float() * p["upstream"]).sum()
    return (out, *torch.autograd.grad(loss, [p[name] for name in GRAD_NAMES]))


def detached(tensors):
    return [t.detach().clone() for t in tensors]


def first_difference(got, want):
    for name, a, b in zip(("out",) + GRAD_NAMES, got, want):
        if not torch.equal(a, b):
            return name
    return None


def main():
    p = make_inputs()
    print(f"dit_block: exactjit {exactjit.version()} ({exactjit.library_path()}), {torch.cuda.get_device_name()}, "
          f"H={H} D={D} T={T} B={B} S={S}")

    with torch.no_grad():
        rows = adaln_table(p)
        if not torch.equal(block(p, rows), eager_block(p, rows)):
            fail("the block's forward differs from eager PyTorch on the same AdaLN table")
    print("dit_block: forward = eager PyTorch, bit for bit (given the table)")

    # The first call compiles or loads every kernel of forward and backward: the warm-up capture needs.
    want = detached(step(p))
    again = detached(step(p))
    exactjit.synchronize()
    if first_difference(again, want):
        fail(f"forward + backward is not repeatable: {first_difference(again, want)} differs")
    if not all(torch.isfinite(t.float()).all() for t in want):
        fail("a gradient is not finite")
    print(f"dit_block: forward + backward repeatable bit for bit ({len(GRAD_NAMES)} gradients)")

    side = torch.cuda.Stream()  # capture-safe warm-up on a side stream, as torch.cuda.graph advises
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step(p)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step(p)
    for replay in (1, 2):
        graph.replay()
        torch.cuda.synchronize()
        exactjit.synchronize()
        if first_difference(static, want):
            fail(f"CUDA graph replay {replay}: {first_difference(static, want)} differs from eager mode")
    print("dit_block: forward + backward in one CUDA graph, 2 replays = eager mode, bit for bit")
    print("dit_block: ok")


if __name__ == "__main__":
    main()
