"""Which HF weights a critic checkpoint has, checked before any weight is loaded (torch and transformers are
imported only to list the family's keys).

Our HF format is the family's transformers ``*ForTokenClassification`` with ``num_labels=1`` (e.g.
``LlamaForTokenClassification``, ``Qwen3MoeForTokenClassification``): the family's trunk ``model.*`` plus the value
head ``score.weight`` ``[1, H]``; on transformers 5.x bias-free (``token_classification_bias=False``), on 4.57.x,
whose head always has a bias, with a zero ``score.bias`` ``[1]`` (``critic_config``). The Megatron head has no bias:
a ``score.bias`` is accepted only when exactly zero (``check_head_bias``, which reads its value).

``check_critic_keys(shapes, hf_config)`` classifies the keys of a checkpoint dir (``{key: shape}``):
  * every trunk key of the config's model (``trunk_shapes``: the family's own HF model, built on the meta device,
    keys as its checkpoints store them) must be there with its shape, else ValueError listing them;
  * ``score.weight`` present with shape ``[1, H]``: an existing critic, the head is loaded ('loaded');
    absent: a causal LM, the head is initialised by the caller ('missing'); any other shape: ValueError;
  * expected and dropped (a causal LM's LM head): ``lm_head.weight`` ``[V, H]``; with tied embeddings there is no
    such key, the embedding is the trunk's ``model.embed_tokens.weight``, kept for the (untied) critic's input only;
  * ``score.bias`` ``[1]`` beside ``score.weight`` (the 4.57.x format): allowed here, its value is checked by
    ``check_head_bias``; any other shape, or without ``score.weight``: ValueError;
  * ignored: ``*.rotary_emb.inv_freq`` (a buffer older transformers saved; recomputed from the config) and what the
    family's HF class ignores on load (e.g. DeepSeek-V3's multi-token-prediction layer);
  * anything else (e.g. a foreign head, a layer beyond ``num_hidden_layers``): ValueError listing the keys and
    naming the converter for the known critic formats.

``classify_mcore_checkpoint`` does the same for an mcore distributed checkpoint from its metadata (the head's global
shape): a critic ([1, H], loaded), a causal LM (no head or [V, H], head initialised) or an error. Missing trunk keys
there are refused by megatron's dist-checkpointing itself (strict load); it does not check unexpected ones.
"""
import functools
import json
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

HEAD_KEY = 'score.weight'
HEAD_BIAS_KEY = 'score.bias'
HF_ARCHITECTURE = 'LlamaForTokenClassification'  # of llama3_2_critic; other families: token_classification_class
LM_HEAD_KEY = 'lm_head.weight'
IGNORED_SUFFIXES = ('rotary_emb.inv_freq', )
CONVERT_HINT = ('Critics saved by TRL (v_head.summary.*), OpenRLHF (value_head.weight) or verl (lm_head.weight [1, H]) '
                'convert with `python -m swift_plt.critic.convert --from trl|openrlhf|verl SRC DST`.')


def _cfg(config, name, default=None):
    value = config.get(name, default) if isinstance(config, dict) else getattr(config, name, default)
    return default if value is None else value


def text_field(config, name):
    """A decoder field of an HF config (object or dict): top level, else its ``text_config`` (a multimodal
    checkpoint, e.g. Qwen3.5)."""
    value = _cfg(config, name)
    return _cfg(_cfg(config, 'text_config', {}), name) if value is None else value


def config_dict(config) -> dict:
    """An HF config (object or config.json dict) as a dict with its ``model_type`` (default: llama)."""
    config = dict(config) if isinstance(config, dict) else config.to_dict()
    config['model_type'] = config.get('model_type') or default_model_type()
    return config


def token_classification_class(model_type: str):
    """The installed transformers' ``*ForTokenClassification`` of ``model_type``; ValueError where it has none (no
    critic format for that family)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES
    name = MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES.get(model_type)
    if name is None or not hasattr(transformers, name):
        from swift_plt.critic.families import supported_list
        raise ValueError(f'model type `{model_type}` (config.json) has no *ForTokenClassification in transformers '
                         f'{transformers.__version__}, so it has no critic format; critics exist for: '
                         f'{supported_list()}.')
    return getattr(transformers, name)


def trunk_shapes(config) -> Dict[str, Tuple[int, ...]]:
    """``{key: shape}`` of the decoder (``model.*``) of an HF config (object or dict), as the family's checkpoints
    store it (transformers 5.x fuses MoE experts in memory; the keys here are the per-expert ones on disk)."""
    return dict(_trunk(json.dumps(config_dict(config), sort_keys=True, default=str))[0])


def default_model_type() -> str:
    """The family of a config without ``model_type``: the first critic's (``CRITIC_MODEL_TYPE``)."""
    from swift_plt.critic import CRITIC_MODEL_TYPE
    from swift_plt.critic.families import CRITIC_FAMILIES
    return CRITIC_FAMILIES[CRITIC_MODEL_TYPE].hf_model_type


def ignored_on_load(model_type) -> Tuple[str, ...]:
    """What transformers 5.x's class of the family ignores on load and 4.57's does not list
    (``Critic.ignored_on_load``)."""
    from swift_plt import families
    family = families.family(model_type)
    return family.critic.ignored_on_load if family is not None and family.critic is not None else ()


def ignored_patterns(config) -> Tuple[str, ...]:
    """Regexes of checkpoint keys the family's HF class ignores on load (e.g. DeepSeek-V3's MTP layer)."""
    return _trunk(json.dumps(config_dict(config), sort_keys=True, default=str))[1]


def llama_trunk_shapes(config) -> Dict[str, Tuple[int, ...]]:
    """``trunk_shapes`` of a Llama config (object or dict, ``model_type`` taken as llama)."""
    return trunk_shapes({**config_dict(config), 'model_type': default_model_type()})


@functools.lru_cache(maxsize=16)
def _trunk(config_json: str):
    import torch
    from transformers import AutoConfig

    from swift_plt.compat.transformers import hf_rope_guard
    config = json.loads(config_json)
    model_type = config.pop('model_type')
    cls = token_classification_class(model_type)
    config = AutoConfig.for_model(model_type, **config)
    config.num_labels = 1
    with hf_rope_guard(), torch.device('meta'):
        model = cls._from_config(config)
    state_dict = model.state_dict()
    try:  # transformers 5.x: the checkpoint layout (e.g. one tensor per expert)
        from transformers.core_model_loading import revert_weight_conversion
        state_dict = revert_weight_conversion(model, state_dict)
    except ImportError:
        pass
    prefix = f'{cls.base_model_prefix}.'
    shapes = tuple((k, tuple(v.shape)) for k, v in state_dict.items() if k.startswith(prefix))
    return shapes, tuple(getattr(cls, '_keys_to_ignore_on_load_unexpected', None) or ())


def _listed(keys: Iterable[str], limit: int = 20) -> str:
    keys = sorted(keys)
    more = f' ... (+{len(keys) - limit} more)' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def check_critic_keys(shapes: Dict[str, Sequence[int]], hf_config, source: str = 'checkpoint') -> str:
    """Validate a checkpoint's ``{key: shape}`` for the critic; return 'loaded' (the value head is in it) or
    'missing' (a causal LM: the caller initialises the head). Raise ValueError (what is wrong, what to do)."""
    patterns = ignored_patterns(hf_config) + ignored_on_load(_cfg(hf_config, 'model_type'))
    ignored = [re.compile(p) for p in patterns]
    shapes = {k: tuple(v) for k, v in shapes.items()
              if not k.endswith(IGNORED_SUFFIXES) and not any(p.search(k) for p in ignored)}
    expected = trunk_shapes(hf_config)
    hidden, vocab = int(text_field(hf_config, 'hidden_size')), int(text_field(hf_config, 'vocab_size'))
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
        model_type = config_dict(hf_config)['model_type']
        raise ValueError(f'{source} is not a `{model_type}` critic or causal LM of this config (hidden_size={hidden}, '
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
    """Global shape of ``output_layer.weight`` (``language_model.output_layer.weight``) in a torch_dist mcore
    checkpoint dir (``iter_XXXXXXX``), or None."""
    from torch.distributed.checkpoint import FileSystemReader
    metadata = FileSystemReader(checkpoint_dir).read_metadata().state_dict_metadata
    # a multimodal checkpoint's (Qwen3.5) head is its language model's
    meta = metadata.get('output_layer.weight') or metadata.get('language_model.output_layer.weight')
    return None if meta is None else tuple(meta.size)


def classify_mcore_checkpoint(head_shape, hidden_size: int, source: str) -> str:
    """'critic' (a [1, H] head: loaded), 'causal_lm' (no head or an LM head [V, H]: initialised) or ValueError."""
    if head_shape == (1, hidden_size):
        return 'critic'
    if head_shape is None or (len(head_shape) == 2 and head_shape[0] > 1 and head_shape[1] == hidden_size):
        return 'causal_lm'
    raise ValueError(f'critic: {source} has output_layer.weight {list(head_shape)}; a critic head is '
                     f'[1, hidden_size] = [1, {hidden_size}], a causal LM head [vocab, {hidden_size}].')


# Config keys of other frameworks' critics that the conversion folds into the weights.
FOLDED_CONFIG_KEYS = ('normalize_reward', 'mean', 'std')


def critic_config(model_type: Optional[str] = None) -> dict:
    """What makes an HF config of ``model_type`` our critic format on the installed transformers: the family's
    ``*ForTokenClassification``, untied, and ``token_classification_bias`` False on 5.x / True on 4.57.x (the zero
    ``score.bias`` it carries; transformers builds every family's head the same way)."""
    from swift_plt.compat.transformers import critic_head_has_bias
    model_type = model_type or default_model_type()
    return {'architectures': [token_classification_class(model_type).__name__], 'tie_word_embeddings': False,
            'token_classification_bias': critic_head_has_bias()}


def critic_hf_config(hf_config):
    """A copy of an HF config object in our critic format (``critic_config()``, ``num_labels=1``)."""
    import copy
    hf_config = copy.deepcopy(hf_config)
    for key, value in critic_config(getattr(hf_config, 'model_type', None)).items():
        setattr(hf_config, key, copy.copy(value))
    hf_config.num_labels = 1
    return hf_config


def critic_hf_config_dict(config: dict) -> dict:
    """The same for a config.json dict (``num_labels`` is saved as ``id2label`` / ``label2id``)."""
    config = {k: v for k, v in config.items() if k not in FOLDED_CONFIG_KEYS + ('num_labels', )}
    config.update(critic_config(config_dict(config)['model_type']), id2label={'0': 'LABEL_0'}, label2id={'LABEL_0': 0})
    return config
