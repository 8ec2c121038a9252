"""The char_gpt example's model and training loop in PyTorch eager, for comparison.

Same configuration as examples/char_gpt.rs: 4 layers, 4 heads, width 128, context 64,
batch 32, character vocabulary, 90/10 split, learned positions, pre-LayerNorm blocks with
a GELU MLP (4x), AdamW (lr 3e-3, betas 0.9/0.99, weight decay 0.1 on matrices and
embeddings), warmup 100 then cosine to 10% at 2,000 steps, clipping at 1.0, no dropout,
N(0, 0.02) initialization. Prints the same lines as the Rust example.

Not run in CI. Usage (PyTorch installed): python3 benches/char_gpt_torch.py [--steps N]
"""

import argparse
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYERS, HEADS, WIDTH, CONTEXT, BATCH = 4, 4, 128, 64, 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.out = nn.Linear(4 * WIDTH, WIDTH)
        self.register_buffer("future", torch.triu(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool), 1))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // HEADS))
        att = att.masked_fill(self.future[:t, :t], float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.tok = nn.Embedding(vocab, WIDTH)
        self.pos = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos.weight[:t]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def lr_at(step):
    if step < 100:
        return 3e-3 * (step + 1) / 100
    progress = min((step - 100) / (2000 - 100), 1.0)
    floor = 3e-3 * 0.1
    return floor + (3e-3 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    args = ap.parse_args()
    torch.manual_seed(1337)
    path = os.path.join(os.path.dirname(__file__), "..", "data", "tinyshakespeare.txt")
    text = open(path, encoding="utf-8").read()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    cut = len(data) * 9 // 10
    train, val = data[:cut], data[cut:]

    def batch(split, gen):
        starts = torch.randint(len(split) - CONTEXT - 1, (BATCH,), generator=gen)
        x = torch.stack([split[s : s + CONTEXT] for s in starts])
        y = torch.stack([split[s + 1 : s + CONTEXT + 1] for s in starts])
        return x, y

    model = Gpt(len(chars))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    plain = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}],
        lr=3e-3,
        betas=(0.9, 0.99),
        eps=1e-8,
    )
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{sum(p.numel() for p in model.parameters())} parameters")
    gen = torch.Generator().manual_seed(1)
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = batch(train, gen)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
        lv = loss.item()
        times.append((time.perf_counter() - t0) * 1e3)
        if (step + 1) % 250 == 0 or step == 0:
            print(f"step {step + 1} loss {lv:.4f} ms/step {statistics.median(times[-250:]):.1f}")
    vgen = torch.Generator().manual_seed(2024)
    with torch.no_grad():
        losses = []
        for _ in range(10):
            x, y = batch(val, vgen)
            logits = model(x)
            losses.append(F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1)).item())
    print(f"val_loss: {statistics.mean(losses):.4f}")
    print(f"step_ms: eager={statistics.median(times):.1f}")


if __name__ == "__main__":
    main()
