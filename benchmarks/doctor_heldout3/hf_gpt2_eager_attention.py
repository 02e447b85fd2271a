"""DDP training of a Hugging Face GPT-2 (built from a config) with attn_implementation="eager" on 1,024-token sequences.

Mistake: the model is created with `AutoModelForCausalLM.from_config(config, attn_implementation="eager")`,
a setting copied from a fine-tuning recipe (several model cards and warnings recommend "eager" for
training some architectures, and it is required for output_attentions). GPT-2 then computes attention as
matmul -> add the 4-D causal mask -> softmax -> matmul, materialising a batch x heads x 1024 x 1024 score
matrix (and its gradient) in every layer, instead of calling torch's scaled_dot_product_attention, whose
fused CPU kernel never materialises it.
Source: https://github.com/ContextualAI/gritlm/issues/9 ("eager vs. flash vs. sdpa": "SDPA with the latest
torch version is the best for both speed & memory"), https://github.com/pytorch/pytorch/issues/98505
(materialising the attention weights is "precisely why" SDPA is faster than naive attention) and
https://github.com/huggingface/transformers/issues/30461 (training speed depends on SDPA getting its
fused path).
Fix (--fix): attn_implementation="sdpa" (the default); same weights, same function.
Expected diagnosis: forward/backward dominated by the unfused attention (T x T matmuls, mask add,
softmax and their backward, memory-bound) in GPT-2's eager_attention_forward, selected by
attn_implementation="eager" in main; use "sdpa".
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from transformers import AutoModelForCausalLM, GPT2Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, SEQ = 1024, 1024


def synthetic_corpus(samples: int, seed: int = 0) -> torch.Tensor:
    """Token windows from a sparse random Markov chain, so the LM has something to learn."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, VOCAB, (VOCAB, 8), generator=g)
    tokens = torch.empty(samples, SEQ, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, VOCAB, (samples,), generator=g)
    choice = torch.randint(0, 8, (samples, SEQ), generator=g)
    for t in range(1, SEQ):
        tokens[:, t] = successors[tokens[:, t - 1], choice[:, t]]
    return tokens


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    tokens = synthetic_corpus(2 * 12 * args.batch_size)
    dataset = TensorDataset(tokens)
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
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa" if args.fix else "eager")
    model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        losses = []
        for (batch,) in loader:
            loss = model(input_ids=batch, labels=batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            if meter.step(len(batch)):
                break
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {float(torch.stack(losses).mean()):.4f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
