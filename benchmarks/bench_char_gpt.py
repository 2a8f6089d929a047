"""One training step of examples/char_transformer.py's GPT against the same model in PyTorch.

Both: 4 blocks, d_model 128, 4 heads, block 64, batch 16, vocabulary 96, dropout 0.1;
forward, cross-entropy, backward, gradient clipping and an AdamW step with two parameter
groups. One thread each (set before NumPy and PyTorch load); EveryO and PyTorch are timed in
alternating blocks and the medians compared.

    OMP_NUM_THREADS=1 python benchmarks/bench_char_gpt.py [--quick]
"""

from __future__ import annotations

import os

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"

import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, os.path.dirname(__file__))

from _timing import torch_or_none  # noqa: E402
from char_transformer import GPT, Config, parameter_groups  # noqa: E402

import everyo as eo  # noqa: E402

VOCAB = 96


def everyo_step(cfg: Config):
    model = GPT(cfg, VOCAB)
    optimizer = eo.AdamW(parameter_groups(model, 0.1), lr=1e-3)
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, (cfg.batch_size, cfg.block_size))
    y = rng.integers(0, VOCAB, (cfg.batch_size, cfg.block_size))

    def step():
        optimizer.zero_grad()
        loss = eo.cross_entropy(model(x), y)
        loss.backward()
        eo.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step


def torch_step(torch, cfg: Config):
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
            self.proj = nn.Linear(cfg.d_model, cfg.d_model)
            self.dropout = nn.Dropout(cfg.dropout)
            self.register_buffer("future", ~torch.tril(torch.ones(cfg.block_size,
                                                                   cfg.block_size, dtype=bool)))

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=-1)
            q, k, v = (z.view(b, t, cfg.heads, d // cfg.heads).transpose(1, 2) for z in (q, k, v))
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // cfg.heads))
            scores = scores.masked_fill(self.future[:t, :t], float("-inf"))
            attention = self.dropout(scores.softmax(-1))
            return self.dropout(self.proj((attention @ v).transpose(1, 2).reshape(b, t, d)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.attention = nn.LayerNorm(cfg.d_model), Attention()
            self.norm2 = nn.LayerNorm(cfg.d_model)
            self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                     nn.Linear(4 * cfg.d_model, cfg.d_model),
                                     nn.Dropout(cfg.dropout))

        def forward(self, x):
            x = x + self.attention(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    class TorchGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(VOCAB, cfg.d_model)
            self.positions = nn.Embedding(cfg.block_size, cfg.d_model)
            self.dropout = nn.Dropout(cfg.dropout)
            self.blocks = nn.ModuleList([Block() for _ in range(cfg.layers)])
            self.norm, self.head = nn.LayerNorm(cfg.d_model), nn.Linear(cfg.d_model, VOCAB)

        def forward(self, ids):
            x = self.dropout(self.tokens(ids) + self.positions(torch.arange(ids.shape[1])))
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    torch.set_num_threads(1)
    model = TorchGPT()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.integers(0, VOCAB, (cfg.batch_size, cfg.block_size)))
    y = torch.tensor(rng.integers(0, VOCAB, (cfg.batch_size, cfg.block_size)))

    def step():
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step


def timed(step, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - start) / n


def main() -> int:
    quick = "--quick" in sys.argv
    cfg = Config(batch_size=16, block_size=64, d_model=128, layers=4, heads=4)
    ours = everyo_step(cfg)
    torch = torch_or_none()
    theirs = torch_step(torch, cfg) if torch is not None else None
    ours(), ours()
    if theirs is not None:
        theirs(), theirs()
    ours_times, theirs_times = [], []
    for _ in range(2 if quick else 5):
        ours_times.append(timed(ours, 2 if quick else 5))
        if theirs is not None:
            theirs_times.append(timed(theirs, 2 if quick else 5))
    ours_ms = 1e3 * statistics.median(ours_times)
    if theirs is None:
        print(f"char GPT training step: EveryO {ours_ms:.1f} ms (PyTorch not installed)")
        return 0
    theirs_ms = 1e3 * statistics.median(theirs_times)
    print(f"char GPT training step (1 thread): EveryO {ours_ms:.1f} ms, PyTorch "
          f"{theirs_ms:.1f} ms, ratio {ours_ms / theirs_ms:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
