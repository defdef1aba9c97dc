import torch, sys
sys.path.insert(0, "tests")
from eagle_zoo.kernels.qkv_rope import qkv_rope_write_kv_triton
from eagle_zoo.kernels.linear import fused_linear_triton
from eagle_zoo.kernels.rope import rope_neox_triton
from test_kernels import _rope_problem
dev = torch.device("cuda")
for dtype in (torch.float32, torch.bfloat16):
    hq, hk, d, K = 9, 3, 64, 96
    _, _, cos, sin = _rope_problem(dev, dtype, hq=hq, hk=hk, d=d)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, K, generator=g).to(dev, dtype)
    w = (0.2 * torch.randn((hq + 2 * hk) * d, K, generator=g)).to(dev, dtype)
    kc = torch.zeros(4, 400, hk, d, device=dev, dtype=dtype); vc = kc.clone()
    slots = torch.tensor([2, 0], device=dev); pos = torch.tensor([[0, 7, 399], [5, 6, 7]], device=dev)
    q = qkv_rope_write_kv_triton(x, w, cos, sin, kc, vc, slots, pos, hq, hk, eps=1e-5)
    qkv = fused_linear_triton(x, w).view(2, 3, hq + 2 * hk, d)
    q2, k2 = rope_neox_triton(qkv[:, :, :hq], qkv[:, :, hq:hq + hk], cos, sin)
    x1, x2 = qkv[:, :, :hq, :d // 2].float(), qkv[:, :, :hq, d // 2:].float()
    c = cos.to(dtype).float(); s = sin.to(dtype).float()
    r = lambda t: t.to(dtype).float()
    nofma = torch.cat([r(x1 * c) + r(x2 * -s), r(x2 * c) + r(x1 * s)], -1).to(dtype)
    fma1 = (x1.double() * c.double() + r(x2 * -s).double()).float()
    fma2 = (x2.double() * c.double() + r(x1 * s).double()).float()
    fma = torch.cat([fma1, fma2], -1).to(dtype)
    for name, t in (("fused", q), ("separate", q2)):
        print(dtype, name, "!= nofma", (t != nofma).sum().item(), "!= fma(first)", (t != fma).sum().item(), "of", t.numel())
