"""Import critics saved by other RLHF frameworks into our format (torch + safetensors; transformers only to tell its
format; no ms-swift).

Our format: an HF ``<Family>ForTokenClassification`` dir with ``num_labels=1`` (the family of SRC's config.json
``model_type``, e.g. Llama, Qwen3, Qwen3-MoE): the trunk ``model.*`` and the value head ``score.weight`` ``[1, H]``,
written for the installed transformers: bias-free on 5.x (``token_classification_bias=False``), plus a zero
``score.bias`` ``[1]`` on 4.57.x (whose head always has a bias; see swift_plt.critic.keys). It loads in plain
transformers, and ``swift export --to_mcore`` / ``megatron ... --model`` load it with the family's critic model type
(``--model_type llama3_2_critic``, ``qwen3_critic``, ...: swift_plt.critic.families).

Formats (``--from``), all on the family's trunk ``model.*`` as its checkpoints store it:
  trl       TRL ``AutoModelForCausalLMWithValueHead``: ``v_head.summary.weight`` [1, H], ``v_head.summary.bias`` [1];
            its ``lm_head.weight`` (the policy's LM head) is dropped.
  openrlhf  OpenRLHF ``CriticModel``: ``value_head.weight`` [1, H] (no bias). With ``normalize_reward`` in its
            config.json the values are ``(w.h - mean) / std``: ``1/std`` is folded into the weight (exact) and
            ``-mean/std`` is a bias (rule below).
  verl      verl critic: ``lm_head.weight`` [1, H] (+ ``lm_head.bias`` if saved), or ``score.weight`` [1, H]
            (+ ``score.bias``) as saved by transformers' token-classification head.
Bias rule: our head, like mcore-bridge's seq_cls head, has no bias (4.57.x's ``score.bias`` is written as zero), and
a constant cannot be folded into a linear map of RMS-normalised hidden states. A bias that is exactly 0 is dropped
(exact); any other bias is an error, unless ``--drop_bias``: every value then shifts by ``-bias`` (a warning says by
how much); for GAE the advantages change by ``(gamma - 1) * bias`` per step, so fine-tune the converted critic before
relying on it.
Every other key must be a trunk key of the config (checked with swift_plt.critic.keys before anything is written).

CLI: ``python -m swift_plt.critic.convert --from trl|openrlhf|verl SRC DST [--drop_bias]``.
"""
import argparse
import glob
import json
import os
import shutil
import sys
from typing import Dict, Optional, Tuple

import torch

from swift_plt.compat.transformers import critic_head_has_bias
from swift_plt.critic.keys import HEAD_BIAS_KEY, HEAD_KEY, LM_HEAD_KEY, check_critic_keys, critic_hf_config_dict

FORMATS = {
    # format: ((head weight key, its bias key), ... tried in order), other keys dropped
    'trl': ((('v_head.summary.weight', 'v_head.summary.bias'), ), (LM_HEAD_KEY, )),
    'openrlhf': ((('value_head.weight', 'value_head.bias'), ), ()),
    'verl': (((LM_HEAD_KEY, 'lm_head.bias'), (HEAD_KEY, 'score.bias')), ()),
}
WEIGHT_SUFFIXES = ('.safetensors', '.bin', '.pt', '.pth')
MAX_SHARD_BYTES = 5 * 1024**3


def convert_state_dict(state_dict: Dict[str, torch.Tensor], fmt: str, config: dict,
                       drop_bias: bool = False) -> Tuple[Dict[str, torch.Tensor], Optional[str]]:
    """``fmt`` critic state dict -> our ``{model.*, score.weight}`` (+ a zero ``score.bias`` on transformers 4.57.x);
    returns it and a warning (or None).
    Raises ValueError (what is wrong, what to do) on anything it cannot convert exactly."""
    if fmt not in FORMATS:
        raise ValueError(f'unknown critic format {fmt!r}; known: {", ".join(FORMATS)}')
    heads, dropped = FORMATS[fmt]
    found = [(w, b) for w, b in heads if w in state_dict]
    if len(found) != 1:
        raise ValueError(f'--from {fmt}: expected exactly one value head among '
                         f'{[w for w, _ in heads]}, found {[w for w, _ in found] or "none"}.')
    weight_key, bias_key = found[0]
    out = {k: v for k, v in state_dict.items() if k not in (weight_key, bias_key) + dropped}
    weight = state_dict[weight_key]
    hidden = int(config['hidden_size'])
    if tuple(weight.shape) != (1, hidden):
        raise ValueError(f'--from {fmt}: {weight_key} has shape {list(weight.shape)}; a value head is '
                         f'[1, hidden_size] = [1, {hidden}].')
    bias = state_dict.get(bias_key)
    bias = torch.zeros(1, dtype=torch.float64) if bias is None else bias.double().reshape(-1)
    if bias.numel() != 1:
        raise ValueError(f'--from {fmt}: {bias_key} has shape {list(state_dict[bias_key].shape)}, expected [1].')
    weight = weight.double()
    if config.get('normalize_reward'):  # OpenRLHF: (w.h - mean) / std
        mean, std = float(config.get('mean', 0.0)), float(config.get('std', 1.0))
        weight, bias = weight / std, (bias - mean) / std
    warning = None
    if bias.item() != 0:
        if not drop_bias:
            raise ValueError(f'--from {fmt}: the value head has a non-zero bias ({bias.item():.6g}); the critic head '
                             'has none and a constant cannot be folded into it. Pass --drop_bias to drop it (every '
                             'value shifts by -bias), then fine-tune the critic.')
        warning = f'dropped value-head bias {bias.item():.6g}: every value shifts by {-bias.item():.6g}'
    out[HEAD_KEY] = weight.to(state_dict[weight_key].dtype)
    if critic_head_has_bias():
        out[HEAD_BIAS_KEY] = torch.zeros(1, dtype=out[HEAD_KEY].dtype)
    check_critic_keys({k: tuple(v.shape) for k, v in out.items()}, config, source=f'--from {fmt} checkpoint')
    return out, warning


def load_state_dict(src: str) -> Dict[str, torch.Tensor]:
    """All tensors of ``src`` (``*.safetensors``, else ``pytorch_model*.bin`` / ``*.pt``)."""
    files = sorted(glob.glob(os.path.join(src, '*.safetensors')))
    state_dict = {}
    if files:
        from safetensors.torch import load_file
        for path in files:
            state_dict.update(load_file(path))
        return state_dict
    files = sorted(glob.glob(os.path.join(src, '*.bin')) + glob.glob(os.path.join(src, '*.pt')))
    files = [f for f in files if os.path.basename(f) != 'training_args.bin']
    if not files:
        raise FileNotFoundError(f'no *.safetensors / *.bin weights in {src}')
    for path in files:
        state_dict.update(torch.load(path, map_location='cpu', weights_only=True, mmap=True))
    return state_dict


def save_state_dict(state_dict: Dict[str, torch.Tensor], dst: str, max_shard_bytes: int = MAX_SHARD_BYTES) -> None:
    """Safetensors in transformers' layout (``model.safetensors``, or shards + ``model.safetensors.index.json``)."""
    from safetensors.torch import save_file
    shards, current, size = [], {}, 0
    for key in sorted(state_dict):
        tensor = state_dict[key].contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[key] = tensor
        size += nbytes
    shards.append(current)
    if len(shards) == 1:
        save_file(shards[0], os.path.join(dst, 'model.safetensors'), metadata={'format': 'pt'})
        return
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        name = f'model-{i + 1:05d}-of-{len(shards):05d}.safetensors'
        save_file(shard, os.path.join(dst, name), metadata={'format': 'pt'})
        weight_map.update({k: name for k in shard})
        total += sum(t.numel() * t.element_size() for t in shard.values())
    with open(os.path.join(dst, 'model.safetensors.index.json'), 'w') as f:
        json.dump({'metadata': {'total_size': total}, 'weight_map': weight_map}, f, indent=2)


def convert(fmt: str, src: str, dst: str, drop_bias: bool = False) -> Optional[str]:
    """Convert the ``fmt`` critic dir ``src`` into our format in ``dst`` (must not exist or be empty); return the
    warning, if any. Nothing is written unless the whole checkpoint converts."""
    if os.path.isdir(dst) and os.listdir(dst):
        raise FileExistsError(f'{dst} exists and is not empty')
    with open(os.path.join(src, 'config.json')) as f:
        config = json.load(f)
    state_dict, warning = convert_state_dict(load_state_dict(src), fmt, config, drop_bias)
    os.makedirs(dst, exist_ok=True)
    save_state_dict(state_dict, dst)
    with open(os.path.join(dst, 'config.json'), 'w') as f:
        json.dump(critic_hf_config_dict(config), f, indent=2)
    for path in glob.glob(os.path.join(src, '*')):  # tokenizer, generation config, chat template, ...
        name = os.path.basename(path)
        if (os.path.isfile(path) and not name.endswith(WEIGHT_SUFFIXES) and not name.endswith('.index.json')
                and name != 'config.json'):
            shutil.copy(path, os.path.join(dst, name))
    return warning


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog='python -m swift_plt.critic.convert',
        description='Convert a TRL / OpenRLHF / verl critic into an HF <Family>ForTokenClassification(num_labels=1) '
        'dir that `swift export --to_mcore` and `megatron ... --model_type <family critic>` load (e.g. '
        'llama3_2_critic, qwen3_critic).')
    parser.add_argument('--from', dest='fmt', required=True, choices=sorted(FORMATS))
    parser.add_argument('src')
    parser.add_argument('dst')
    parser.add_argument('--drop_bias', action='store_true', help='drop a non-zero value-head bias (values shift)')
    args = parser.parse_args(argv)
    try:
        warning = convert(args.fmt, args.src, args.dst, args.drop_bias)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    if warning:
        print(f'WARNING: {warning}', file=sys.stderr)
    with open(os.path.join(args.dst, 'config.json')) as f:
        architecture = json.load(f)['architectures'][0]
    print(f'wrote {args.dst} ({architecture}, num_labels=1)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
