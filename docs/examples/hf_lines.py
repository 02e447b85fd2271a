"""Hugging Face models and a Hugging Face dataset, as `paratrain train` takes them: no wrapper.

The data is real and offline: the lines of the Python standard library's own sources, as bytes (token ids
0-255, no tokenizer), each labelled 1 if it is a comment and 0 if it is code, with the comment's `#` taken off
(prose or code, then). Run from this folder:

    python hf_lines.py runs/lines        # a DatasetDict (train: 6 packages, test: email), save_to_disk
    paratrain train --model hf_lines:bert --dataset runs/lines --workers 2 --epochs 2 --batch-size 32 \\
        --optimizer adamw --lr 1e-3                     # dict samples; the classes (2) read from the labels
    paratrain train --workload gpt-tiny --model hf_lines:gpt2 --workers 2 --seq-len 64 --epochs 2 \\
        --samples-per-epoch 2048 --optimizer adamw --lr 1e-3    # a causal LM on (input, next byte) windows

The factories are what a user writes for any model: a function that builds it from the numbers paratrain
reads from the data (`num_classes`, `vocab_size`, `seq_len`).
"""

import sys
import sysconfig
from pathlib import Path

from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

LONGEST = 64  # bytes of a line kept


def gpt2(vocab_size: int, seq_len: int) -> GPT2LMHeadModel:
    return GPT2LMHeadModel(
        GPT2Config(
            n_layer=4, n_embd=128, n_head=4, vocab_size=vocab_size, n_positions=seq_len, bos_token_id=0, eos_token_id=0
        )
    )


def bert(num_classes: int, seq_len: int) -> BertForSequenceClassification:
    return BertForSequenceClassification(
        BertConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=2,
            intermediate_size=128,
            vocab_size=256,
            max_position_embeddings=seq_len,
            num_labels=num_classes,
        )
    )


def lines(*packages: str) -> dict[str, list]:
    """The lines of standard-library packages' sources, as bytes without the `#` of a comment, and whether each
    was a comment: every comment, and as many code lines, evenly spaced (half and half: chance is 50 %)."""
    comments, code = [], []
    for package in packages:
        for path in sorted((Path(sysconfig.get_paths()["stdlib"]) / package).rglob("*.py")):
            for line in path.read_bytes().splitlines():
                text = line.strip().lstrip(b"#").strip()[:LONGEST]
                if text:
                    (comments if line.strip().startswith(b"#") else code).append(list(text))
    code = [code[i * len(code) // len(comments)] for i in range(len(comments))]
    return {"input_ids": comments + code, "label": [1] * len(comments) + [0] * len(code)}


if __name__ == "__main__":
    import datasets

    train = lines("asyncio", "importlib", "logging", "multiprocessing", "unittest", "xml")
    datasets.DatasetDict(
        train=datasets.Dataset.from_dict(train), test=datasets.Dataset.from_dict(lines("email"))
    ).save_to_disk(sys.argv[1])
