"""A small GPT trained on characters of the Python standard library's own source code.

The corpus is on every machine that runs this script, so nothing is downloaded. The model and
the training loop are written the way a PyTorch (nanoGPT-style) script is, with EveryO's
equivalents:

- a decoder-only transformer: ``eo.ModuleList`` of blocks, causal self-attention written with
  ``split``/``view``/``swapaxes``/``masked_fill``/``softmax``, GELU MLP, pre-LayerNorm;
- ``eo.init.normal_(std=0.02)`` on weights, and the nanoGPT scaling of residual projections;
- ``eo.AdamW`` with two parameter groups (weight decay on matrices, none on biases, norms);
- warm-up then cosine decay (``eo.SequentialLR`` of ``eo.LinearLR`` and
  ``eo.CosineAnnealingLR``), gradient clipping with ``eo.clip_grad_norm_``;
- checkpoint/resume that continues bit for bit: model, optimizer, scheduler, the step and the
  random generators (``eo.get_rng_state``) in one ``eo.save`` file;
- sampling with temperature and top-k.

Run::

    OMP_NUM_THREADS=1 python examples/char_transformer.py --steps 2000
    OMP_NUM_THREADS=1 python examples/char_transformer.py --quick          # seconds
    python examples/char_transformer.py --steps 400 --checkpoint ckpt.npz  # saves on the way
    python examples/char_transformer.py --steps 800 --checkpoint ckpt.npz --resume
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import everyo as eo


@dataclass
class Config:
    block_size: int = 64
    d_model: int = 128
    layers: int = 4
    heads: int = 4
    dropout: float = 0.1
    batch_size: int = 16
    steps: int = 2000
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.1
    corpus_chars: int = 1_000_000


# -- data --------------------------------------------------------------------------------------

def stdlib_corpus(limit: int) -> str:
    """Up to ``limit`` characters of the standard library's ``.py`` files, in a fixed order."""
    root = Path(os.__file__).parent
    parts, total = [], 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= limit:
            break
    # NOTE: printable ASCII plus newline: a small, fixed vocabulary on every machine.
    text = "".join(parts)[:limit]
    return "".join(c if c == "\n" or 32 <= ord(c) < 127 else "?" for c in text)


class CharCodec:
    """Characters to ids and back."""

    def __init__(self, text: str):
        self.chars = sorted(set(text) | {"?"})
        self.index = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.index.get(c, self.index["?"]) for c in text], dtype=np.int64)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def random_windows(data: np.ndarray, block: int, batch: int):
    """``batch`` random windows of ``block`` ids and the ids that follow each (the targets),
    drawn from the global generator so that a checkpoint of it resumes the same batches."""
    starts = eo.default_generator().integers(0, len(data) - block - 1, batch)
    x = np.stack([data[s:s + block] for s in starts])
    y = np.stack([data[s + 1:s + block + 1] for s in starts])
    return x, y


# -- model -------------------------------------------------------------------------------------

class CausalSelfAttention(eo.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = eo.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = eo.Linear(cfg.d_model, cfg.d_model)
        self.dropout = eo.Dropout(cfg.dropout)
        self.future = ~np.tril(np.ones((cfg.block_size, cfg.block_size), dtype=bool))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, axis=-1)
        # (b, t, d) -> (b, heads, t, d / heads), as ported code does with view + transpose
        q, k, v = (z.view(b, t, self.heads, d // self.heads).swapaxes(1, 2) for z in (q, k, v))
        scores = (q @ k.swapaxes(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        scores = scores.masked_fill(self.future[:t, :t], -np.inf)
        attention = self.dropout(eo.softmax(scores, axis=-1))
        out = (attention @ v).swapaxes(1, 2).reshape(b, t, d)
        return self.dropout(self.proj(out))


class Block(eo.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.norm1 = eo.LayerNorm(cfg.d_model)
        self.attention = CausalSelfAttention(cfg)
        self.norm2 = eo.LayerNorm(cfg.d_model)
        self.mlp = eo.Sequential(eo.Linear(cfg.d_model, 4 * cfg.d_model), eo.GELU(),
                                 eo.Linear(4 * cfg.d_model, cfg.d_model), eo.Dropout(cfg.dropout))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(eo.Module):
    def __init__(self, cfg: Config, vocab: int):
        super().__init__()
        self.block_size = cfg.block_size
        self.tokens = eo.Embedding(vocab, cfg.d_model)
        self.positions = eo.Embedding(cfg.block_size, cfg.d_model)
        self.dropout = eo.Dropout(cfg.dropout)
        self.blocks = eo.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.norm = eo.LayerNorm(cfg.d_model)
        self.head = eo.Linear(cfg.d_model, vocab)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                eo.init.zeros_(p)
            elif p.ndim >= 2:
                # NOTE: nanoGPT's scaling: residual projections shrink with depth.
                residual = name.endswith(("proj.weight", "mlp.2.weight"))
                std = 0.02 / math.sqrt(2 * cfg.layers) if residual else 0.02
                eo.init.normal_(p, std=std)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.dropout(self.tokens(ids) + self.positions(np.arange(t)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def parameter_groups(model: eo.Module, weight_decay: float) -> list:
    """Weight decay on matrices (linear weights, embeddings); none on biases and norms."""
    decay = [p for _, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def generate(model: GPT, codec: CharCodec, prompt: str, length: int,
             temperature: float = 0.8, top_k: int = 10) -> str:
    """Continue ``prompt`` by ``length`` characters, sampling the top ``top_k`` each time."""
    model.eval()
    ids = list(codec.encode(prompt))
    rng = eo.default_generator()
    with eo.no_grad():
        for _ in range(length):
            context = np.array([ids[-model.block_size:]])
            logits = model(context).data[0, -1].astype(np.float64) / temperature
            cutoff = np.sort(logits)[-top_k]
            logits = np.where(logits < cutoff, -np.inf, logits)
            probs = np.exp(logits - logits.max())
            ids.append(int(rng.choice(len(probs), p=probs / probs.sum())))
    model.train()
    return codec.decode(ids)


# -- training ----------------------------------------------------------------------------------

def build(cfg: Config, vocab: int, seed: int):
    eo.manual_seed(seed)
    model = GPT(cfg, vocab)
    optimizer = eo.AdamW(parameter_groups(model, cfg.weight_decay), lr=cfg.lr,
                         betas=(0.9, 0.99))
    warmup = eo.LinearLR(optimizer, start_factor=0.01, total_iters=cfg.warmup)
    cosine = eo.CosineAnnealingLR(optimizer, T_max=max(cfg.steps - cfg.warmup, 1),
                                  eta_min=cfg.lr / 10)
    scheduler = eo.SequentialLR(optimizer, [warmup, cosine], milestones=[cfg.warmup])
    return model, optimizer, scheduler


def evaluate(model: GPT, data: np.ndarray, cfg: Config, batches: int = 4) -> float:
    """Mean loss on ``batches`` fixed windows of ``data`` (no dropout, no gradients)."""
    model.eval()
    starts = np.linspace(0, len(data) - cfg.block_size - 2, batches * cfg.batch_size).astype(int)
    losses = []
    with eo.no_grad():
        for chunk in np.split(starts, batches):
            x = np.stack([data[s:s + cfg.block_size] for s in chunk])
            y = np.stack([data[s + 1:s + cfg.block_size + 1] for s in chunk])
            losses.append(eo.cross_entropy(model(x), y).item())
    model.train()
    return float(np.mean(losses))


def save_checkpoint(path, step, model, optimizer, scheduler) -> None:
    eo.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "rng": eo.get_rng_state(model)}, path)


def load_checkpoint(path, model, optimizer, scheduler) -> int:
    checkpoint = eo.load(path)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    eo.set_rng_state(checkpoint["rng"], model)
    return int(checkpoint["step"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=Config.steps)
    parser.add_argument("--quick", action="store_true", help="a tiny model, for tests")
    parser.add_argument("--checkpoint", help="save here every --every steps and at the end")
    parser.add_argument("--every", type=int, default=200)
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--stop-after", type=int, help="stop (and save) after this step")
    parser.add_argument("--sample", type=int, default=300, help="characters to generate")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    cfg = Config(steps=args.steps)
    if args.quick:
        cfg = Config(block_size=32, d_model=32, layers=2, heads=2, batch_size=8,
                     steps=args.steps, lr=1e-2, warmup=5, corpus_chars=100_000)
    text = stdlib_corpus(cfg.corpus_chars)
    codec = CharCodec(text)
    data = codec.encode(text)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    print(f"corpus: {len(text)} characters of the standard library, vocabulary {len(codec.chars)}")

    model, optimizer, scheduler = build(cfg, len(codec.chars), args.seed)
    print(f"model: {sum(p.size for p in model.parameters())} parameters")
    step = 0
    if args.resume:
        step = load_checkpoint(args.checkpoint, model, optimizer, scheduler)
        print(f"resumed at step {step}")
    last = args.stop_after if args.stop_after is not None else cfg.steps
    start = time.perf_counter()
    loss = float("nan")
    while step < last:
        x, y = random_windows(train_data, cfg.block_size, cfg.batch_size)
        optimizer.zero_grad()
        loss_tensor = eo.cross_entropy(model(x), y)
        loss_tensor.backward()
        eo.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        step += 1
        loss = loss_tensor.item()
        if step == 1 or step % 50 == 0 or step == last:
            print(f"step {step} loss {loss:.4f} lr {scheduler.get_last_lr()[0]:.3e}")
        if args.checkpoint and (step % args.every == 0 or step == last):
            save_checkpoint(args.checkpoint, step, model, optimizer, scheduler)
    elapsed = time.perf_counter() - start
    print(f"final train loss {loss!r}")
    print(f"val loss {evaluate(model, val_data, cfg):.4f} ({elapsed:.1f} s training)")
    if args.sample:
        print("sample:")
        print(generate(model, codec, "def ", args.sample))
    return 0


if __name__ == "__main__":
    sys.exit(main())
