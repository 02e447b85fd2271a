"""Hugging Face GPT-2 (from a config) fine-tuned as a classifier from its last token, with logits for every position.

Mistake: the user turns a small causal LM into a yes/no classifier the prompt way: the class is read from
the next-token logits of two verbalizer tokens at the *last* position,
`model(input_ids=batch).logits[:, -1, VERBALIZERS]`. The forward call computes the language-model head for
all 128 positions, a 128 x 64 x 8,192 vocabulary projection per sequence (and its backward, mostly
zeros), although only one position's two logits are used; the LM head is far more work than the two
small transformer layers.
Source: https://github.com/NVIDIA/Isaac-GR00T/pull/734 ("Skip full-vocabulary logits the backbone never
reads (logits_to_keep=1) ... evaluates lm_head unconditionally ... producing a [B, S, 151936] tensor that is
discarded on the next line. The logits_to_keep parameter exists for exactly this case"),
https://github.com/huggingface/transformers/pull/31292 (num_logits_to_keep: "removing useless logits
computation"), https://github.com/huggingface/trl/pull/2683.
Fix (--fix): model(input_ids=batch, logits_to_keep=1): the head runs on the last position only; identical
logits for that position, identical gradients.
Expected diagnosis: forward and backward dominated by the language-model head (the vocabulary matmul,
[batch x 128 x 64] @ [64 x 8192], and its weight-gradient), computed for every position in main's
model(input_ids=...) call although only the last position's logits are read; pass logits_to_keep=1 (or
slice the hidden state before the head).
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from transformers import AutoModelForCausalLM, GPT2Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, SEQ = 8192, 128
VERBALIZERS = torch.tensor([5, 6])  # the tokens " no" and " yes" of the prompt template


def synthetic_prompts(samples: int, seed: int = 0):
    """Token sequences whose label says whether 'positive' tokens outnumber 'negative' ones."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, VOCAB, (samples, SEQ), generator=g)
    positive = (ids % 7 == 0).sum(1)
    negative = (ids % 7 == 1).sum(1)
    return ids, (positive > negative).long()


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    ids, labels = synthetic_prompts(2 * 16 * args.batch_size)
    dataset = TensorDataset(ids, labels)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=64,
        n_layer=2,
        n_head=2,
        attn_pdrop=0.0,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = DDP(AutoModelForCausalLM.from_config(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        correct = total = 0
        for batch, yb in loader:
            if args.fix:
                logits = model(input_ids=batch, logits_to_keep=1).logits[:, -1, VERBALIZERS]
            else:
                logits = model(input_ids=batch).logits[:, -1, VERBALIZERS]
            loss = F.cross_entropy(logits, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            correct += int((logits.argmax(1) == yb).sum())
            total += len(yb)
            if meter.step(len(yb)):
                break
        if dist.get_rank() == 0:
            print(f"epoch {epoch} train accuracy {correct / max(total, 1):.3f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
