"""Hugging Face Accelerate LM training that gathers the full vocabulary logits every step for a metric.

Mistake: to log training token accuracy the user calls accelerator.gather_for_metrics((logits, labels))
on every micro-batch and takes the argmax afterwards. The logits are batch x sequence x vocabulary floats
(16 MiB per rank here), so each step all-gathers tens of MiB over the network and every rank then scans
the whole world's logits, just to count correct tokens.
Source: https://github.com/huggingface/transformers/issues/22602 and
https://github.com/huggingface/transformers/pull/22603 (logits gathered across devices before being
reduced by preprocess_logits_for_metrics), https://github.com/huggingface/accelerate/issues/226 (gather
of predictions at every step) and https://github.com/huggingface/trl/pull/6678 ("no longer runs
accelerator.gather_for_metrics on every compute_loss step").
Fix (--fix): reduce before gathering, as preprocess_logits_for_metrics does: gather the argmax token ids
(and labels) instead of the logits; the accuracy is identical, training unchanged.
Expected diagnosis: a large all-gather every step outside backward (accelerator.gather_for_metrics of
the logits in main's training loop), communication/memory-bandwidth bound; gather predictions, not
logits.
"""

import gc
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, DIM, HEADS, LAYERS = 8192, 128, 4, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM)
        x = x + self.out(att)
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        return self.head(self.blocks(self.emb(idx)))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--accumulate", type=int, default=2)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
    corpus = torch.randint(0, VOCAB, (200_000,), generator=torch.Generator().manual_seed(1))
    starts = torch.randint(0, len(corpus) - args.seq_len - 1, (256, 1), generator=torch.Generator().manual_seed(2))
    windows = corpus[starts + torch.arange(args.seq_len + 1)]
    loader = DataLoader(TensorDataset(windows), batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    meter, samples, done = Meter(args), 0, False
    while not done:
        correct = total = 0
        for (tokens,) in loader:
            inputs, labels = tokens[:, :-1], tokens[:, 1:]
            with accelerator.accumulate(model):
                logits = model(inputs)
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if args.fix:
                predictions, targets = accelerator.gather_for_metrics((logits.detach().argmax(-1), labels))
            else:
                all_logits, targets = accelerator.gather_for_metrics((logits.detach(), labels))
                predictions = all_logits.argmax(-1)
            correct += int((predictions == targets).sum())
            total += targets.numel()
            samples += len(tokens)
            if accelerator.sync_gradients:
                done, samples = meter.step(samples), 0
                if done:
                    break
        accelerator.print(f"train token accuracy {correct / max(total, 1):.4f}")
        done = meter.end_epoch() or done
    meter.report()
    del model, optimizer
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
