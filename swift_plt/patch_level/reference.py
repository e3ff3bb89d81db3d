"""PatchTrain (Shao et al., arXiv 2407.12665) written the obvious way in plain PyTorch: the one reference that the
tests and GPU checks compare the PLT kernels (``loss``, ``loss_triton``) and models with."""
import torch
import torch.nn.functional as F

from swift_plt.patch_level import IGNORE_INDEX


def patch_logits(model, input_ids, patch_size):
    """PatchTrain's forward on a plain HF causal LM: patch = mean of K token embeddings, positions 0..P-1.
    input_ids [B, S] (a batch, or one row of real tokens as [1, n]), S a multiple of K -> logits [B, P, V]."""
    B, S = input_ids.shape
    P = S // patch_size
    emb = model.get_input_embeddings()(input_ids).view(B, P, patch_size, -1).mean(2)
    position_ids = torch.arange(P, device=input_ids.device).expand(B, P)
    hidden = model.model(inputs_embeds=emb, position_ids=position_ids, use_cache=False).last_hidden_state
    return model.lm_head(hidden)


def token_nll(logits, labels, patch_size):
    """Token-aligned NLL [B, S] in fp64: at (b, (p+1)K + k), -log softmax(logits[b, p])[labels[b, (p+1)K + k]];
    0 on the first patch (nothing predicts it) and where the label is -100. logits [B, P, V], labels [B, P*K]."""
    B, P, _ = logits.shape
    if tuple(labels.shape) != (B, P * patch_size):
        raise ValueError(f'labels {tuple(labels.shape)} do not match logits {tuple(logits.shape)} at K={patch_size}')
    logp = torch.log_softmax(logits.double(), -1)
    zero = logp.new_zeros(())
    targets = labels.tolist()
    rows = []
    for b in range(B):
        row = [zero] * patch_size
        for p in range(P - 1):
            for k in range(patch_size):
                y = targets[b][(p + 1) * patch_size + k]
                row.append(zero if y == IGNORE_INDEX else -logp[b, p, y])
        rows.append(torch.stack(row))
    return torch.stack(rows)


def reference_nll(logits, labels, patch_size):
    """(sum, count) of the NLL over the valid (patch, k) pairs (fp64 sum, int count); labels token-aligned."""
    count = int((labels[:, patch_size:] != IGNORE_INDEX).sum())
    return token_nll(logits, labels, patch_size).sum(), count


def reference_loss(logits, labels, patch_size):
    """The PLT loss: mean NLL over the valid (patch, k) pairs (fp64)."""
    total, count = reference_nll(logits, labels, patch_size)
    return total / count


def padded_batch_nll(model, input_ids, labels, lengths, patch_size):
    """(sum, count) over a padded batch, each row run on its own real tokens (its first lengths[b], a multiple of K)."""
    total, count = 0.0, 0
    for b, n in enumerate(lengths):
        s, c = reference_nll(patch_logits(model, input_ids[b:b + 1, :n], patch_size), labels[b:b + 1, :n], patch_size)
        total, count = total + s, count + c
    return total, count


def patchtrain_loss(logits, labels, patch_size):
    """PatchTrain's own formula (fp64): (1/K) sum_k nll_loss(log_softmax(logits[:, :-1]), labels[:, K:].view(B, P-1,
    K)[..., k]); equals reference_loss when no label is ignored."""
    B, P, V = logits.shape
    log_probs = F.log_softmax(logits[:, :-1].double(), dim=-1).reshape(-1, V)
    targets = labels[:, patch_size:].reshape(B, P - 1, patch_size).to(logits.device)
    return sum(F.nll_loss(log_probs, targets[..., k].reshape(-1)) for k in range(patch_size)) / patch_size
