"""HF Accelerate (cpu=True, prepare) bag-of-words text classifier with a 50,000 x 128 embedding, trained at 16
documents per rank.

Mistake: a fastText-style classifier (nn.EmbeddingBag over a 50,000-token vocabulary, 128 dimensions, mean
pooling, one linear layer) is trained at a per-rank batch of 16 documents. The embedding's gradient is
dense (sparse=False, the default), so every step DDP all-reduces 25.6 MB of mostly-zero gradient for 16
documents' worth of look-ups: the forward and backward take a few milliseconds, the all-reduce of the
whole table several times that, and backward has nothing to hide it behind. The ranks spend most of the
step exchanging (and waiting for each other in) gradient buckets.
Source: https://github.com/huggingface/accelerate/issues/1244 (multi-node/multi-process training slower,
time in accelerator.backward; gradient accumulation reduces the time per step),
https://github.com/pytorch/pytorch/issues/14462 ("my model is big, I am trying to perform all-reduce on
gradient every N steps"), https://github.com/facebookresearch/ClassyVision/pull/656 ("unnecessarily
syncing the gradients during gradient accumulation steps ... removes the communication bottleneck").
Fix (--fix): Accelerate's gradient accumulation, `Accelerator(gradient_accumulation_steps=8)` with
`accelerator.accumulate(model)` (no_sync on the first 7 micro-batches, loss scaled by 1/8): one all-reduce
and one optimizer step per 128 documents per rank, and the learning rate scaled linearly (x8).
Expected diagnosis: communication-bound: the step is dominated by the DDP gradient all-reduce of the dense
25.6 MB embedding gradient (issued from accelerator.backward), which backward over 16 documents cannot
hide; all-reduce less often per sample (gradient accumulation / larger per-rank batch, LR scaled).
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

VOCAB, DIM, TOKENS, CLASSES, BASE_LR = 50_000, 128, 48, 4, 0.5


def synthetic_documents(docs: int, seed: int = 0):
    """Token-id documents whose class sets how often each token of a class-specific block of 200 appears."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (docs,), generator=g)
    tokens = torch.randint(0, VOCAB, (docs, TOKENS), generator=g)
    topical = torch.rand(docs, TOKENS, generator=g) < 0.25
    keyword = labels[:, None] * 200 + torch.randint(0, 200, (docs, TOKENS), generator=g)
    return torch.where(topical, keyword, tokens), labels


class BagOfWords(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.EmbeddingBag(VOCAB, DIM, mode="mean")
        self.classifier = nn.Linear(DIM, CLASSES)

    def forward(self, tokens):
        return self.classifier(self.embedding(tokens))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accumulate", type=int, default=8, help="micro-batches per optimizer step with --fix")
    args = parser.parse_args()
    accumulate = args.accumulate if args.fix else 1
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulate)
    tokens, labels = synthetic_documents(2 * 40 * args.batch_size)
    loader = DataLoader(TensorDataset(tokens, labels), batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    model = BagOfWords()
    # linear LR scaling with the documents per optimizer step
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR * accumulate)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    meter, epoch, pending, done = Meter(args), 0, 0, False
    while not done:
        total_loss = correct = seen = 0
        for xb, yb in loader:
            with accelerator.accumulate(model):
                logits = model(xb)
                loss = F.cross_entropy(logits, yb)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            total_loss += loss.item() * len(yb)
            correct += int((logits.argmax(1) == yb).sum())
            seen += len(yb)
            pending += len(yb)
            if accelerator.sync_gradients:
                done, pending = meter.step(pending), 0
                if done:
                    break
        accelerator.print(
            f"epoch {epoch} train loss {total_loss / max(seen, 1):.4f} accuracy {correct / max(seen, 1):.3f}"
        )
        epoch += 1
        done = meter.end_epoch() or done
    meter.report()
    del model, optimizer
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
