"""A `kda run` round trip through files another tool writes and reads (PyTorch + safetensors).
`cargo xtask gpu-session` runs it on the GPU machine: `make`, then `kda run` on the GPU and with
`--cpu`, then `compare`.

    python3 tests/interop/torch_roundtrip.py make IN.safetensors [LENGTHS HEADS]
        writes a ragged problem the way Python model code holds it: a leading batch dimension of
        1, int32 cu_seqlens, bf16 k/w/u, f32 gk and h0. LENGTHS is comma-separated (default
        0,1,64,200,129,7) and HEADS defaults to 4.
    python3 tests/interop/torch_roundtrip.py compare IN.safetensors GPU_OUT.safetensors CPU_OUT.safetensors
        reads both `kda run` outputs back with safetensors and prints the relative Frobenius
        error of the GPU's h, v_new, ht against the f64 reference's; exits 1 above 1e-3.
"""
import sys

import torch
from safetensors.torch import load_file, save_file

CHUNK, K, V, H = 64, 128, 128, 4
LENGTHS = [0, 1, 64, 200, 129, 7]
BOUND = 1e-3


def make(path, lengths=None, heads=None):
    global LENGTHS, H
    if lengths is not None:
        LENGTHS, H = [int(n) for n in lengths.split(",")], int(heads)
    g = torch.Generator().manual_seed(2026)
    t = sum(LENGTHS)
    k = torch.randn(1, t, H, K, generator=g)
    k = k / k.norm(dim=-1, keepdim=True)
    w = 0.05 * torch.randn(1, t, H, K, generator=g)
    u = 0.5 * torch.randn(1, t, H, V, generator=g)
    steps = -0.2 * torch.rand(1, t, H, K, generator=g)
    gk = torch.empty_like(steps)
    start = 0
    for n in LENGTHS:  # cumulative log2 gates restart at every chunk of every sequence
        for c in range(start, start + n, CHUNK):
            end = min(c + CHUNK, start + n)
            gk[:, c:end] = steps[:, c:end].cumsum(dim=1)
        start += n
    cu = torch.tensor([0] + list(torch.tensor(LENGTHS).cumsum(0)), dtype=torch.int32)
    h0 = 0.1 * torch.randn(len(LENGTHS), H, K, V, generator=g)
    save_file(
        {"k": k.bfloat16(), "w": w.bfloat16(), "u": u.bfloat16(), "gk": gk, "h0": h0, "cu_seqlens": cu},
        path,
        metadata={"producer": "torch " + torch.__version__},
    )
    print(f"wrote {path}: lengths {LENGTHS}, H = {H}, T = {t}")


def compare(inp, gpu_path, cpu_path):
    # The layout comes from the input file, so any file `make` wrote can be checked.
    given = load_file(inp)
    cu = given["cu_seqlens"].tolist()
    lengths, heads = [b - a for a, b in zip(cu, cu[1:])], given["k"].shape[-2]
    gpu, cpu = load_file(gpu_path), load_file(cpu_path)
    n_chunks = sum((n + CHUNK - 1) // CHUNK for n in lengths)
    expect = {"h": (n_chunks, heads, K, V), "v_new": (sum(lengths), heads, V), "ht": (len(lengths), heads, K, V)}
    worst = 0.0
    for name, shape in expect.items():
        a, b = gpu[name].double(), cpu[name].double()
        assert tuple(a.shape) == shape and tuple(b.shape) == shape, (name, a.shape, b.shape, shape)
        err = ((a - b).norm() / b.norm()).item()
        worst = max(worst, err)
        print(f"{name}: shape {list(shape)} {gpu[name].dtype}, rel err GPU vs f64 reference {err:.3e}")
    sys.exit(0 if worst < BOUND else 1)


if __name__ == "__main__":
    {"make": make, "compare": compare}[sys.argv[1]](*sys.argv[2:])
