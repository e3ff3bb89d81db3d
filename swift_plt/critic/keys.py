"""Which HF weights a ``llama3_2_critic`` checkpoint has, checked before any weight is loaded (imports no torch).

Our HF format is transformers' ``LlamaForTokenClassification`` with ``num_labels=1``: the Llama trunk ``model.*``
plus the value head ``score.weight`` ``[1, H]``; on transformers 5.x bias-free (``token_classification_bias=False``),
on 4.57.x, whose head always has a bias, with a zero ``score.bias`` ``[1]`` (``critic_config``). The Megatron head
has no bias: a ``score.bias`` is accepted only when exactly zero (``check_head_bias``, which reads its value).

``check_critic_keys(shapes, hf_config)`` classifies the keys of a checkpoint dir (``{key: shape}``):
  * every trunk key of the config's Llama must be there with its shape, else ValueError listing them;
  * ``score.weight`` present with shape ``[1, H]``: an existing critic, the head is loaded ('loaded');
    absent: a causal LM, the head is initialised by the caller ('missing'); any other shape: ValueError;
  * expected and dropped (a causal LM's LM head): ``lm_head.weight`` ``[V, H]``; with tied embeddings there is no
    such key, the embedding is the trunk's ``model.embed_tokens.weight``, kept for the (untied) critic's input only;
  * ``score.bias`` ``[1]`` beside ``score.weight`` (the 4.57.x format): allowed here, its value is checked by
    ``check_head_bias``; any other shape, or without ``score.weight``: ValueError;
  * ignored: ``*.rotary_emb.inv_freq`` (a buffer older transformers saved; recomputed from the config);
  * anything else (e.g. a foreign head, a layer beyond ``num_hidden_layers``): ValueError listing the keys and
    naming the converter for the known critic formats.

``classify_mcore_checkpoint`` does the same for an mcore distributed checkpoint from its metadata (the head's global
shape): a critic ([1, H], loaded), a causal LM (no head or [V, H], head initialised) or an error. Missing trunk keys
there are refused by megatron's dist-checkpointing itself (strict load); it does not check unexpected ones.
"""
from typing import Dict, Iterable, List, Sequence, Tuple

HEAD_KEY = 'score.weight'
HEAD_BIAS_KEY = 'score.bias'
HF_ARCHITECTURE = 'LlamaForTokenClassification'
LM_HEAD_KEY = 'lm_head.weight'
IGNORED_SUFFIXES = ('rotary_emb.inv_freq', )
CONVERT_HINT = ('Critics saved by TRL (v_head.summary.*), OpenRLHF (value_head.weight) or verl (lm_head.weight [1, H]) '
                'convert with `python -m swift_plt.critic.convert --from trl|openrlhf|verl SRC DST`.')


def _cfg(config, name, default=None):
    value = config.get(name, default) if isinstance(config, dict) else getattr(config, name, default)
    return default if value is None else value


def llama_trunk_shapes(config) -> Dict[str, Tuple[int, ...]]:
    """``{key: shape}`` of the Llama decoder (``model.*``) described by an HF config (object or dict)."""
    hidden = int(_cfg(config, 'hidden_size'))
    heads = int(_cfg(config, 'num_attention_heads'))
    kv_heads = int(_cfg(config, 'num_key_value_heads', heads))
    head_dim = int(_cfg(config, 'head_dim', hidden // heads))
    ffn = int(_cfg(config, 'intermediate_size'))
    vocab = int(_cfg(config, 'vocab_size'))
    attn_bias = bool(_cfg(config, 'attention_bias', False))
    mlp_bias = bool(_cfg(config, 'mlp_bias', False))
    shapes = {'model.embed_tokens.weight': (vocab, hidden), 'model.norm.weight': (hidden, )}
    for i in range(int(_cfg(config, 'num_hidden_layers'))):
        p = f'model.layers.{i}.'
        linears = {
            'self_attn.q_proj': (heads * head_dim, hidden, attn_bias),
            'self_attn.k_proj': (kv_heads * head_dim, hidden, attn_bias),
            'self_attn.v_proj': (kv_heads * head_dim, hidden, attn_bias),
            'self_attn.o_proj': (hidden, heads * head_dim, attn_bias),
            'mlp.gate_proj': (ffn, hidden, mlp_bias),
            'mlp.up_proj': (ffn, hidden, mlp_bias),
            'mlp.down_proj': (hidden, ffn, mlp_bias),
        }
        for name, (out_dim, in_dim, bias) in linears.items():
            shapes[f'{p}{name}.weight'] = (out_dim, in_dim)
            if bias:
                shapes[f'{p}{name}.bias'] = (out_dim, )
        shapes[f'{p}input_layernorm.weight'] = (hidden, )
        shapes[f'{p}post_attention_layernorm.weight'] = (hidden, )
    return shapes


def _listed(keys: Iterable[str], limit: int = 20) -> str:
    keys = sorted(keys)
    more = f' ... (+{len(keys) - limit} more)' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def check_critic_keys(shapes: Dict[str, Sequence[int]], hf_config, source: str = 'checkpoint') -> str:
    """Validate a checkpoint's ``{key: shape}`` for the critic; return 'loaded' (the value head is in it) or
    'missing' (a causal LM: the caller initialises the head). Raise ValueError (what is wrong, what to do)."""
    shapes = {k: tuple(v) for k, v in shapes.items() if not k.endswith(IGNORED_SUFFIXES)}
    expected = llama_trunk_shapes(hf_config)
    hidden, vocab = expected['model.norm.weight'][0], expected['model.embed_tokens.weight'][0]
    problems: List[str] = []
    missing = set(expected) - set(shapes)
    if missing:
        problems.append(f'missing keys: {_listed(missing)}')
    wrong = [f'{k} {list(shapes[k])} (expected {list(v)})' for k, v in expected.items() if k in shapes and
             shapes[k] != v]
    head = shapes.get(HEAD_KEY)
    if head is not None and tuple(head) != (1, hidden):
        wrong.append(f'{HEAD_KEY} {list(head)} (a value head is [1, hidden_size] = [1, {hidden}]; a '
                     f'{list(head)} head is not a scalar critic)')
    bias = shapes.get(HEAD_BIAS_KEY)
    if bias is not None and (tuple(bias) != (1, ) or head is None):
        wrong.append(f'{HEAD_BIAS_KEY} {list(bias)} (a value head\'s bias is [1], beside {HEAD_KEY} [1, {hidden}])')
    lm_head = shapes.get(LM_HEAD_KEY)
    if lm_head is not None and tuple(lm_head) != (vocab, hidden):
        wrong.append(f'{LM_HEAD_KEY} {list(lm_head)} (a causal LM head is [vocab_size, hidden_size] = '
                     f'[{vocab}, {hidden}]; a [1, H] lm_head is a verl critic: convert it first)')
    if wrong:
        problems.append(f'wrong shapes: {"; ".join(wrong)}')
    unexpected = set(shapes) - set(expected) - {HEAD_KEY, HEAD_BIAS_KEY, LM_HEAD_KEY}
    if unexpected:
        problems.append(f'unexpected keys: {_listed(unexpected)}')
    if problems:
        raise ValueError(f'{source} is not a Llama critic or causal LM of this config (hidden_size={hidden}, '
                         f'vocab_size={vocab}): ' + '; '.join(problems) + f'. {CONVERT_HINT}')
    return 'loaded' if head is not None else 'missing'


def read_safetensors_shapes(model_dir: str) -> Dict[str, Tuple[int, ...]]:
    """``{key: shape}`` of every tensor in the ``*.safetensors`` files of ``model_dir`` (headers only)."""
    import glob
    import os

    from safetensors import safe_open
    files = sorted(glob.glob(os.path.join(model_dir, '*.safetensors')))
    if not files:
        raise FileNotFoundError(f'no *.safetensors file in {model_dir}')
    shapes = {}
    for path in files:
        with safe_open(path, framework='pt') as f:
            for key in f.keys():
                shapes[key] = tuple(f.get_slice(key).get_shape())
    return shapes


def read_head_bias(model_dir: str):
    """The ``score.bias`` tensor of the ``*.safetensors`` files of ``model_dir``, or None if there is none."""
    import glob
    import os

    from safetensors import safe_open
    for path in sorted(glob.glob(os.path.join(model_dir, '*.safetensors'))):
        with safe_open(path, framework='pt') as f:
            if HEAD_BIAS_KEY in f.keys():
                return f.get_tensor(HEAD_BIAS_KEY)
    return None


def check_head_bias(bias, source: str = 'checkpoint') -> None:
    """Accept a missing or exactly-zero ``score.bias``; refuse any other (the critic's head has no bias, so it could
    not be represented: every value would silently shift), with the converter that drops it."""
    if bias is None or not bool(bias.detach().float().ne(0).any()):
        return
    values = ', '.join(f'{float(v):.6g}' for v in bias.detach().float().reshape(-1)[:4])
    raise ValueError(f'{source} has a non-zero value-head bias {HEAD_BIAS_KEY} = [{values}]; the critic\'s value head '
                     f'has no bias (mcore-bridge\'s seq_cls head), so the critic cannot represent it (a zero '
                     f'{HEAD_BIAS_KEY} is accepted). To drop it (every value then shifts by -bias), convert with '
                     '`python -m swift_plt.critic.convert --from verl SRC DST --drop_bias`, then fine-tune the critic.')


def mcore_checkpoint_head_shape(checkpoint_dir: str):
    """Global shape of ``output_layer.weight`` in a torch_dist mcore checkpoint dir (``iter_XXXXXXX``), or None."""
    from torch.distributed.checkpoint import FileSystemReader
    meta = FileSystemReader(checkpoint_dir).read_metadata().state_dict_metadata.get('output_layer.weight')
    return None if meta is None else tuple(meta.size)


def classify_mcore_checkpoint(head_shape, hidden_size: int, source: str) -> str:
    """'critic' (a [1, H] head: loaded), 'causal_lm' (no head or an LM head [V, H]: initialised) or ValueError."""
    if head_shape == (1, hidden_size):
        return 'critic'
    if head_shape is None or (len(head_shape) == 2 and head_shape[0] > 1 and head_shape[1] == hidden_size):
        return 'causal_lm'
    raise ValueError(f'llama3_2_critic: {source} has output_layer.weight {list(head_shape)}; a critic head is '
                     f'[1, hidden_size] = [1, {hidden_size}], a causal LM head [vocab, {hidden_size}].')


# Config keys of other frameworks' critics that the conversion folds into the weights.
FOLDED_CONFIG_KEYS = ('normalize_reward', 'mean', 'std')


def critic_config() -> dict:
    """What makes an HF Llama config our critic format on the installed transformers: LlamaForTokenClassification,
    untied, and ``token_classification_bias`` False on 5.x / True on 4.57.x (the zero ``score.bias`` it carries)."""
    from swift_plt.compat.transformers import critic_head_has_bias
    return {'architectures': [HF_ARCHITECTURE], 'tie_word_embeddings': False,
            'token_classification_bias': critic_head_has_bias()}


def critic_hf_config(hf_config):
    """A copy of an HF config object in our critic format (``critic_config()``, ``num_labels=1``)."""
    import copy
    hf_config = copy.deepcopy(hf_config)
    for key, value in critic_config().items():
        setattr(hf_config, key, copy.copy(value))
    hf_config.num_labels = 1
    return hf_config


def critic_hf_config_dict(config: dict) -> dict:
    """The same for a config.json dict (``num_labels`` is saved as ``id2label`` / ``label2id``)."""
    config = {k: v for k, v in config.items() if k not in FOLDED_CONFIG_KEYS + ('num_labels', )}
    config.update(critic_config(), id2label={'0': 'LABEL_0'}, label2id={'LABEL_0': 0})
    return config
