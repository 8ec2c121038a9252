"""PyTorch eager reference for `examples/cnn_digits.rs`: the same model (two blocks of
Conv2d 3x3 padding 1, ReLU, MaxPool2d(2), then Flatten and Linear), AdamW with the same
settings, batch 64 of 8x8 images, on 2 threads. Prints the median training-step time.

Not run in CI. `python benches/cnn_digits_torch.py [--steps N]` with torch installed.
Random images stand in for the digits: a step's time does not depend on the values.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 2 * 2, 10),
    )
    opt = torch.optim.AdamW(model.parameters(), 3e-3, (0.9, 0.999), 1e-8, 1e-4)
    y = torch.arange(64) % 10
    times = []
    for _ in range(args.steps):
        x = torch.rand(64, 1, 8, 8)
        t = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    print(f"step_ms: {times[len(times) // 2]:.2f} (median of {len(times)} steps, batch 64, torch {torch.__version__})")


if __name__ == "__main__":
    main()
