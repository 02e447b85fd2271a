"""Hugging Face models and data as a user writes them for `--model` / `--dataset`: tiny configs built from
their config classes (nothing downloaded), and data with a pattern a causal LM can learn."""

import torch
from torch.utils.data import Dataset, TensorDataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

PERIOD = 5  # the byte pattern repeats every PERIOD tokens: next-token chance 1/PERIOD, learnable to 100 %
FIRST_TOKEN = 10


def gpt2(vocab_size: int = 256, seq_len: int = 64, n_layer: int = 2, dropout: float = 0.1) -> GPT2LMHeadModel:
    return GPT2LMHeadModel(
        GPT2Config(
            n_layer=n_layer,
            n_embd=32,
            n_head=2,
            vocab_size=vocab_size,
            n_positions=seq_len,
            bos_token_id=0,
            eos_token_id=0,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
        )
    )


def gpt2_four_blocks(vocab_size: int = 256, seq_len: int = 64) -> GPT2LMHeadModel:
    """Without dropout, whose draws differ between one process and micro-batches: runs compare exactly."""
    return gpt2(vocab_size, seq_len, n_layer=4, dropout=0.0)


def llama(vocab_size: int = 256, seq_len: int = 64) -> LlamaForCausalLM:
    return LlamaForCausalLM(
        LlamaConfig(
            num_hidden_layers=2,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=2,
            num_key_value_heads=2,
            vocab_size=vocab_size,
            max_position_embeddings=seq_len,
            bos_token_id=0,
            eos_token_id=0,
        )
    )


def bert(num_classes: int = 10) -> BertForSequenceClassification:
    """10 classes unless told otherwise, as the issue's factory had: paratrain must tell it the data's."""
    return BertForSequenceClassification(
        BertConfig(
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=64,
            max_position_embeddings=32,
            num_labels=num_classes,
        )
    )


def pattern(samples: int, length: int, seed: int) -> torch.Tensor:
    """Windows of the repeating sequence FIRST_TOKEN, ..., FIRST_TOKEN + PERIOD - 1 at random phases."""
    phase = torch.randint(0, PERIOD, (samples, 1), generator=torch.Generator().manual_seed(seed))
    return (phase + torch.arange(length)) % PERIOD + FIRST_TOKEN


def pattern_pairs():
    """(input, next-token target) pairs of the pattern, as paratrain's text workload gives them."""
    train, test = pattern(96, 17, seed=0), pattern(32, 17, seed=1)
    return TensorDataset(train[:, :-1], train[:, 1:]), TensorDataset(test[:, :-1], test[:, 1:])


class Listed(Dataset):
    """A map-style dataset of a list's items."""

    def __init__(self, items: list):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


def sentences(samples: int, seed: int) -> list[dict]:
    """Token ids whose class is whether the first one is above the middle of the vocabulary, padded (id 0,
    masked) to 12 from 6 to 12 real tokens; and a text field a model cannot take, as tokenised datasets keep."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 64, (samples, 12), generator=generator)
    mask = (torch.arange(12) < torch.randint(6, 13, (samples, 1), generator=generator)).long()
    return [
        {"input_ids": row * keep, "attention_mask": keep, "label": int(row[0] > 33), "sentence": "..."}
        for row, keep in zip(ids, mask)
    ]


def sentence_pairs():
    return Listed(sentences(96, seed=0)), Listed(sentences(32, seed=1))
