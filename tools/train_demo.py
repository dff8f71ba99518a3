"""Train the small demo model on Python's own documentation and ship it as GGUF.

Reproducible: the text is the docstrings of a fixed, sorted list of stdlib modules (every
10th module held out for evaluation), the tokenizer is a SentencePiece BPE model with
byte fallback, the model a llama-architecture transformer (a few million parameters)
written with homelab's GGUF writers and quantized to Q4_K_M with llama.cpp's quantizer.

    .venv/bin/pip install -e '.[train]'
    .venv/bin/python tools/train_demo.py            # trains, writes homelab/gguf/trained/
    .venv/bin/python tools/train_demo.py --check    # re-trains into a temp dir, compares loss
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib
import inspect
import json
import math
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from homelab.gguf import generator, vocab  # noqa: E402
from homelab.gguf.quantize import quantize_file  # noqa: E402

OUT_DIR = ROOT / "homelab" / "gguf" / "trained"
STEM = "homelab-trained-llama"
SEED = 1234
N_VOCAB = 2048
CTX = 128
SPEC = generator.ArchSpec(
    "llama",
    n_vocab=N_VOCAB,
    n_embd=192,
    n_layer=4,
    n_head=3,  # head size 64: quantized K/V caches (q8_0, q4_0) need a multiple of 32
    n_head_kv=3,
    n_ff=512,
    context_length=CTX * 4,
)
MODULES = sorted(
    """abc argparse array ast asyncio base64 bisect builtins bz2 calendar cmath codecs
    collections colorsys concurrent configparser contextlib copy csv ctypes dataclasses datetime
    decimal difflib dis doctest email enum filecmp fileinput fnmatch fractions ftplib functools
    gc getopt getpass gettext glob graphlib gzip hashlib heapq hmac html http imaplib
    importlib inspect io ipaddress itertools json keyword linecache locale logging lzma
    mailbox math mimetypes mmap multiprocessing netrc numbers operator optparse os pathlib
    pdb pickle pkgutil platform plistlib poplib pprint profile pstats py_compile pyclbr
    queue quopri random re reprlib rlcompleter runpy sched secrets selectors shelve shlex
    shutil signal site smtplib socket socketserver sqlite3 ssl stat statistics string
    struct subprocess symtable sys sysconfig tabnanny tarfile tempfile textwrap threading
    time timeit token tokenize trace traceback tracemalloc types typing unicodedata unittest
    urllib uuid warnings wave weakref webbrowser xml zipapp zipfile zipimport zlib""".split()  # noqa: SIM905
)
HELD_OUT_EVERY = 10


def module_text(name: str) -> str:
    """Docstrings of a module and its public members, in a fixed order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = importlib.import_module(name)
        parts = [inspect.cleandoc(mod.__doc__ or "")]
        for attr in sorted(a for a in dir(mod) if not a.startswith("_")):
            obj = getattr(mod, attr, None)
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and getattr(obj, "__module__", name) == name:
                parts.append(inspect.cleandoc(doc))
    return "\n\n".join(p for p in parts if p.strip())


def corpus() -> tuple[str, str]:
    """(training text, held-out text): every HELD_OUT_EVERY-th module is held out."""
    train, held = [], []
    for i, name in enumerate(MODULES):
        (held if i % HELD_OUT_EVERY == 5 else train).append(module_text(name))
    return "\n\n".join(train), "\n\n".join(held)


def train_tokenizer(text: str, folder: Path) -> spm.SentencePieceProcessor:
    src = folder / "train.txt"
    src.write_text(text, encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(src),
        model_prefix=str(folder / "spm"),
        vocab_size=N_VOCAB,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        user_defined_symbols=["<|im_start|>", "<|im_end|>"],
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        split_digits=True,
        max_sentence_length=1 << 16,
        num_threads=2,
        minloglevel=2,
        input_sentence_size=0,
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
    )
    return spm.SentencePieceProcessor(model_file=str(folder / "spm.model"))


def gguf_vocabulary(sp: spm.SentencePieceProcessor) -> vocab.Vocabulary:
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(float(sp.get_score(i)))
        if sp.is_unknown(i):
            types.append(vocab.UNKNOWN)
        elif sp.is_control(i):
            types.append(vocab.CONTROL)
        elif sp.is_byte(i):
            types.append(vocab.BYTE)
        elif tokens[-1].startswith("<|"):
            types.append(vocab.USER_DEFINED)
        else:
            types.append(vocab.NORMAL)
    assert tokens[: len(vocab.SPECIALS)] == list(vocab.SPECIALS), tokens[:5]
    return vocab.Vocabulary(tuple(tokens), tuple(scores), tuple(types))


def as_chat(para: str) -> str:
    """A paragraph as one ChatML turn: its first line asked, the paragraph answered."""
    question = para.split("\n", 1)[0][:120]
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n{para}<|im_end|>\n"


def encode(sp: spm.SentencePieceProcessor, text: str, chat: bool = True) -> torch.Tensor:
    """Every other paragraph as plain text, the others as a chat turn (so chat answers too);
    ``chat=False``: every paragraph plain (held-out perplexity is measured on that, since a
    chat turn repeats its question and would flatter the figure)."""
    ids: list[int] = []
    for i, para in enumerate(text.split("\n\n")):
        if chat and i % 2:
            ids += [vocab.BOS_ID, *sp.encode(as_chat(para))]  # ends with <|im_end|>
        else:
            ids += [vocab.BOS_ID, *sp.encode(para), vocab.EOS_ID]  # a plain text ends too
    return torch.tensor(ids, dtype=torch.long)


def unigram_perplexity(train: torch.Tensor, held: torch.Tensor) -> float:
    """The baseline a model must beat: token frequencies of the training data (add-one)."""
    counts = torch.bincount(train, minlength=N_VOCAB).double() + 1.0
    logp = (counts / counts.sum()).log()
    return math.exp(-float(logp[held].mean()))


class RMSNorm(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on adjacent pairs, as llama.cpp's LLAMA (rope type NORM) applies it."""
    _, _, t, d = x.shape
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(t, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        e, f = SPEC.n_embd, SPEC.n_ff
        self.attn_norm, self.ffn_norm = RMSNorm(e), RMSNorm(e)
        self.q, self.k, self.v, self.o = (nn.Linear(e, e, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(e, f, bias=False), nn.Linear(e, f, bias=False)
        self.down = nn.Linear(f, e, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, e = x.shape
        h = self.attn_norm(x)
        q, k, v = (
            m(h).view(b, t, SPEC.n_head, -1).transpose(1, 2) for m in (self.q, self.k, self.v)
        )
        a = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, e))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embd = nn.Embedding(SPEC.n_vocab, SPEC.n_embd)
        self.blocks = nn.ModuleList(Block() for _ in range(SPEC.n_layer))
        self.norm = RMSNorm(SPEC.n_embd)
        self.head = nn.Linear(SPEC.n_embd, SPEC.n_vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embd(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))

    def gguf_tensors(self) -> list[tuple[str, np.ndarray]]:
        def f16(t: torch.Tensor) -> np.ndarray:
            return t.detach().float().numpy().astype(np.float16)

        def f32(t: torch.Tensor) -> np.ndarray:
            return t.detach().float().numpy()

        out = [("token_embd.weight", f16(self.embd.weight))]
        for i, b in enumerate(self.blocks):
            p = f"blk.{i}."
            out += [
                (p + "attn_norm.weight", f32(b.attn_norm.weight)),
                (p + "attn_q.weight", f16(b.q.weight)),
                (p + "attn_k.weight", f16(b.k.weight)),
                (p + "attn_v.weight", f16(b.v.weight)),
                (p + "attn_output.weight", f16(b.o.weight)),
                (p + "ffn_norm.weight", f32(b.ffn_norm.weight)),
                (p + "ffn_gate.weight", f16(b.gate.weight)),
                (p + "ffn_up.weight", f16(b.up.weight)),
                (p + "ffn_down.weight", f16(b.down.weight)),
            ]
        out += [
            ("output_norm.weight", f32(self.norm.weight)),
            ("output.weight", f16(self.head.weight)),
        ]
        return out


def batches(data: torch.Tensor, batch: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(data) - CTX - 1, (batch,), generator=gen)
    return torch.stack([data[s : s + CTX + 1] for s in starts.tolist()])


@torch.no_grad()
def perplexity(model: Llama, data: torch.Tensor) -> float:
    model.eval()
    n = (len(data) - 1) // CTX
    x = data[: n * CTX + 1]
    losses = []
    for i in range(0, n, 16):
        rows = torch.stack([x[j * CTX : j * CTX + CTX + 1] for j in range(i, min(n, i + 16))])
        logits = model(rows[:, :-1])
        losses.append(F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum"))
    model.train()
    return math.exp(float(sum(losses)) / (n * CTX))


def train(steps: int, folder: Path) -> dict[str, object]:
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    train_text, held_text = corpus()
    sp = train_tokenizer(train_text, folder)
    data, held = encode(sp, train_text), encode(sp, held_text, chat=False)
    model = Llama()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(SEED)
    curve: list[tuple[int, float, float]] = []
    t0 = time.monotonic()
    for step in range(1, steps + 1):
        lr = 3e-3 * min(1.0, step / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for g in opt.param_groups:
            g["lr"] = max(lr, 3e-5)
        xy = batches(data, 32, gen)
        loss = F.cross_entropy(model(xy[:, :-1]).flatten(0, 1), xy[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == steps:
            curve.append((step, round(loss.item(), 4), round(time.monotonic() - t0, 1)))
            print(f"step {step} loss {loss.item():.4f} {time.monotonic() - t0:.0f}s", flush=True)
    return {
        "model": model,
        "vocab": gguf_vocabulary(sp),
        "curve": curve,
        "held_text": held_text,
        "held_ppl": perplexity(model, held),
        "unigram_ppl": unigram_perplexity(data, held),
        "train_tokens": len(data),
        "held_tokens": len(held),
        "seconds": round(time.monotonic() - t0, 1),
    }


def write_model(result: dict[str, object], folder: Path) -> tuple[Path, Path]:
    model, vocabulary = result["model"], result["vocab"]
    assert isinstance(model, Llama) and isinstance(vocabulary, vocab.Vocabulary)

    f16 = generator.write_spec_model(
        folder / f"{STEM}-F16.gguf",
        SPEC,
        STEM,
        tensors=model.gguf_tensors(),
        vocabulary=vocabulary,
        description="small demo model trained on Python's documentation",
    )
    q4 = folder / f"{STEM}-Q4_K_M.gguf"
    quantize_file(f16, q4, "Q4_K_M")
    q4.chmod(0o644)
    return f16, q4


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--check", action="store_true", help="re-train, compare with the sidecar")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = train(args.steps, Path(tmp))
    if args.check:
        recorded = json.loads((OUT_DIR / f"{STEM}.json").read_text())
        final = result["curve"][-1][1]  # type: ignore[index]
        print(
            f"recorded final loss {recorded['final_loss']}, now {final}; "
            f"recorded held-out ppl {recorded['held_out_ppl']:.2f}, now {result['held_ppl']:.2f}"
        )
        return
    f16, q4 = write_model(result, OUT_DIR)
    (OUT_DIR / "heldout.txt").write_text(str(result["held_text"])[:20000], encoding="utf-8")
    curve = result["curve"]
    with open(OUT_DIR / "loss.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["step", "train_loss", "elapsed_s"])
        w.writerows(curve)  # type: ignore[arg-type]
    n_params = sum(p.numel() for p in result["model"].parameters())  # type: ignore[attr-defined]
    side = {
        "script": "tools/train_demo.py",
        "seed": SEED,
        "steps": args.steps,
        "git_commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "modules": MODULES,
        "data": f"docstrings of {len(MODULES)} stdlib modules (Python {sys.version.split()[0]}); "
        f"every {HELD_OUT_EVERY}th module (index % {HELD_OUT_EVERY} == 5) held out",
        "train_tokens": result["train_tokens"],
        "held_out_tokens": result["held_tokens"],
        "params": n_params,
        "spec": SPEC.__dict__,
        "tokenizer": "sentencepiece BPE, byte fallback",
        "final_loss": curve[-1][1],
        "held_out_ppl": result["held_ppl"],  # plain held-out text, 128-token windows
        "held_out_unigram_ppl": result["unigram_ppl"],  # the token-frequency baseline
        "uniform_ppl": N_VOCAB,
        "train_seconds": result["seconds"],
        "torch": torch.__version__,
        "files": {p.name: sha256(p) for p in (f16, q4)},
    }
    (OUT_DIR / f"{STEM}.json").write_text(json.dumps(side, indent=2) + "\n")
    print(json.dumps(side, indent=2))


if __name__ == "__main__":
    main()
