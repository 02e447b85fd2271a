"""Speaker-verification training whose GE2E loss is computed with Python loops over speakers and utterances.

Mistake: the generalised end-to-end (GE2E) loss builds the centroids, the speaker-by-utterance-by-centroid
cosine-similarity matrix and the softmax loss one element at a time in nested Python loops (N*M*N tiny
autograd ops forward, as many backward), so a small LSTM embedder spends most of each step in the loss.
Source: https://github.com/HarryVolek/PyTorch_Speaker_Verification/pull/33 ("Vectorized the util
calculations": get_cossim 20.3 ms -> 0.4 ms, "You saved ton of my training time!"); the loops below
follow that repository's utils.py before the PR.
Fix (--fix): the same loss, vectorised: centroids by a mean over utterances, the leave-one-out centroid
by (sum - e)/(M-1), cosine similarities as one batched op, the loss by logsumexp.
Expected diagnosis: the step is dominated by many small CPU ops in the loss function (get_cossim /
calc_loss, a Python loop per element), not by the model, the data or communication; vectorise the loss.
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

SPEAKERS, UTTERANCES, FRAMES, MELS = 8, 6, 40, 40


class SpeechEmbedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(MELS, 128, num_layers=2, batch_first=True)
        self.proj = nn.Linear(128, 64)
        self.w, self.b = nn.Parameter(torch.tensor(10.0)), nn.Parameter(torch.tensor(-5.0))

    def forward(self, x):
        out, _ = self.lstm(x)
        return F.normalize(self.proj(out[:, -1]), dim=1)


def get_centroid(embeddings, speaker_num, utterance_num):
    centroid = 0
    for utterance_id, utterance in enumerate(embeddings[speaker_num]):
        if utterance_id != utterance_num:
            centroid = centroid + utterance
    return centroid / (len(embeddings[speaker_num]) - 1)


def ge2e_loss_loops(embeddings, w, b):
    centroids = torch.stack([sum(speaker) / len(speaker) for speaker in embeddings])
    rows = []
    for j, speaker in enumerate(embeddings):
        for i, utterance in enumerate(speaker):
            sims = []
            for k, centroid in enumerate(centroids):
                if k == j:
                    centroid = get_centroid(embeddings, j, i)
                sims.append(F.cosine_similarity(utterance, centroid, dim=0) + 1e-6)
            rows.append(torch.stack(sims))
    sim = w * torch.stack(rows).view(SPEAKERS, UTTERANCES, SPEAKERS) + b
    loss = 0
    for j in range(SPEAKERS):
        for i in range(UTTERANCES):
            loss = loss - (sim[j, i, j] - (torch.exp(sim[j, i]).sum() + 1e-6).log())
    return loss


def ge2e_loss_vectorised(embeddings, w, b):
    n, m, _ = embeddings.shape
    sums = embeddings.sum(dim=1)
    centroids = sums / m
    exclusive = (sums.unsqueeze(1) - embeddings) / (m - 1)  # leave-one-out centroid of each utterance
    cos = F.cosine_similarity(embeddings.unsqueeze(2), centroids.view(1, 1, n, -1), dim=3)
    own = F.cosine_similarity(embeddings, exclusive, dim=2)
    eye = torch.eye(n, dtype=torch.bool).unsqueeze(1).expand(n, m, n)
    cos = torch.where(eye, own.unsqueeze(2).expand(n, m, n), cos) + 1e-6
    sim = w * cos + b
    positive = sim[eye].view(n, m)
    return -(positive - (torch.exp(sim).sum(dim=2) + 1e-6).log()).sum()


def main():
    args = arguments(__doc__).parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(0)
    voices = torch.randn(200, 1, MELS, generator=gen)  # 200 speakers, each a mean spectrum
    torch.manual_seed(0)
    model = DDP(SpeechEmbedder())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = ge2e_loss_vectorised if args.fix else ge2e_loss_loops
    steps_per_epoch = 12
    meter, epoch = Meter(args), 0
    while True:
        g = torch.Generator().manual_seed(1000 * epoch + rank)
        for _ in range(steps_per_epoch):
            speakers = torch.randperm(len(voices), generator=g)[:SPEAKERS]
            mel = voices[speakers].unsqueeze(1) + torch.randn(SPEAKERS, UTTERANCES, FRAMES, MELS, generator=g)
            emb = model(mel.view(-1, FRAMES, MELS)).view(SPEAKERS, UTTERANCES, -1)
            loss = loss_fn(emb, model.module.w, model.module.b)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if meter.step(SPEAKERS * UTTERANCES):
                break
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
