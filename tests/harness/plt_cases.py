"""One PLT case on CPU, shared by the model tests: a padded batch as ms-swift builds it, the brute-force PatchTrain
loss and gradients on the family's HF model, and the same batch through megatron's schedule on N gloo ranks."""
import torch

K = 4
S = 32
LENS = [32, 20]  # real lengths (multiples of K, as the template pads them); row 1 is padded to S
VOCAB = 512
PAD = 3


def make_batch(seed=0, k=K):
    """A padded batch exactly as ms-swift's megatron collator + the PLT batch patch build it."""
    from swift_plt.patch_level.layout import mask_first_patch
    g = torch.Generator().manual_seed(seed)
    B = len(LENS)
    input_ids = torch.full((B, S), PAD)
    labels = torch.full((B, S), -100)
    position_ids = torch.zeros(B, S, dtype=torch.long)
    mask = torch.tril(torch.ones(B, S, S, dtype=torch.bool)).view(B, 1, S, S)
    for b, n in enumerate(LENS):
        ids = torch.randint(4, VOCAB, (n, ), generator=g)
        input_ids[b, :n] = ids
        labels[b, :n] = ids
        labels[b, :n][torch.rand(n, generator=g) < 0.15] = -100  # some ignored targets
        position_ids[b, :n] = torch.arange(n)
        mask[b, :, :, n:] = 0
    labels = mask_first_patch(labels, position_ids, k)
    return dict(input_ids=input_ids, labels=labels, position_ids=position_ids, attention_mask=~mask)


def hf_plt_reference(hf_dir, batch, k=K, **config):
    """Brute force (swift_plt.patch_level.reference) on plain transformers, each row on its own real tokens;
    ``config``: fields of the HF config replaced (a sliding window in patches). Returns (loss, {hf parameter name:
    grad})."""
    from swift_plt.compat.transformers import hf_rope_guard
    from swift_plt.patch_level.reference import padded_batch_nll

    from .bailing_moe import BailingMoeV2ForCausalLM, is_bailing_moe
    from .hf_reference import as_transformers_5
    if is_bailing_moe(hf_dir):  # no transformers class: the hand-written model of its published code
        assert not config, config
        model = BailingMoeV2ForCausalLM.from_pretrained(hf_dir)
    else:
        with hf_rope_guard():
            model = _causal_lm_class(hf_dir).from_pretrained(hf_dir, dtype=torch.float32, attn_implementation='eager',
                                                             **config)
        as_transformers_5(model)
    for name, value in config.items():  # the config took them (from_pretrained passes unknown names elsewhere)
        assert getattr(model.config, name) == value, name
    model.zero_grad()
    nll, count = padded_batch_nll(model, batch['input_ids'], batch['labels'], LENS, k)
    loss = nll / count
    loss.backward()
    # a multimodal checkpoint's language model under the names of its text config's *ForCausalLM
    return float(loss), {n.replace('model.language_model.', 'model.'): p.grad.clone()
                         for n, p in model.named_parameters() if p.grad is not None}


def _causal_lm_class(hf_dir):
    """transformers' *ForCausalLM of the checkpoint, else (a multimodal one without it: Qwen3-VL) its
    *ForConditionalGeneration, run on text."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    config = AutoConfig.from_pretrained(hf_dir)
    return AutoModelForCausalLM if type(config) in AutoModelForCausalLM._model_mapping else AutoModelForImageTextToText


def patch_level_window(window, k):
    """Patches touched by the W tokens up to and including the last token of a patch (tokens j in patch j // k)."""
    last = window * k - 1  # the last token of patch window - 1: far enough in that the window starts at token >= 0
    return len({j // k for j in range(last - window + 1, last + 1)})


def patch_level_hf_config(hf_dir, k=K):
    """What the brute force changes in the HF config at patch size ``k``: a sliding window of W tokens becomes the
    patches that the same span of text touches (patch_level_window, counted here from token positions, not with
    swift_plt.patch_level.window's rule); nothing else (attention sinks stay). The window as transformers reads
    config.json (Qwen2's is None without use_sliding_window)."""
    from transformers import AutoConfig

    from .bailing_moe import is_bailing_moe
    if is_bailing_moe(hf_dir):
        return {}
    window = getattr(AutoConfig.from_pretrained(hf_dir), 'sliding_window', None)
    return {'sliding_window': patch_level_window(window, k)} if window else {}


def mcore_loss(hf_dir, batch, k, model_type, extra_config=None, all_grads=False, per_token=False):
    """In each spawned rank: forward+backward through megatron's schedule with ms-swift's loss form. Returns
    {'loss'} on the last stage, {'emb_grad'} on the first and, with ``all_grads``, {'grads': {hf name: grad}}
    (the gradients exported through mcore-bridge's own weight export, so every name is the HF one).
    ``per_token``: ms-swift's pre-training form, ``calculate_per_token_loss`` (the schedule gets (sum, count) and
    the gradients are divided by the label-token count afterwards, as ``finalize_model_grads`` does)."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from harness.model import build_mcore_model
    if model_type == 'gpt_plt':
        from swift_plt.plugin.register import plt_gpt_model_meta
        plt_gpt_model_meta()
    elif model_type.endswith('_plt') and model_type != 'llama3_2_plt':  # a hybrid family's PLT type
        from swift_plt.plugin.register import plt_model_meta
        plt_model_meta(model_type[:-len('_plt')])
    elif model_type == 'llama3_2_plt':
        from swift_plt.plugin.register import register_mcore
        assert register_mcore()
    extra = dict(extra_config or {}, calculate_per_token_loss=per_token)
    if model_type.endswith('_plt'):
        extra['patch_size'] = k
    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    models = build_mcore_model(hf_dir, mcore_model_type=model_type, tp=tp, pp=pp, extra_config=extra)
    model = models[0]
    labels = batch['labels']
    if k == 1:  # token-level: ms-swift rolls the labels (the PLT batch patch skips that only at K > 1)
        labels = torch.roll(labels, -1, dims=-1)

    def forward_step(data_iterator, model):
        data = next(data_iterator)
        output = model(input_ids=data['input_ids'], position_ids=data['position_ids'],
                       attention_mask=data['attention_mask'], labels=labels)

        def loss_func(output_tensor):  # ms-swift MegatronTrainer.loss_func, normalised here unless per_token
            mask = labels != -100
            total = torch.sum(output_tensor.float() * mask)
            report = {'loss': torch.stack([total.detach(), mask.sum().float()])}
            return (total, mask.sum(), report) if per_token else (total / mask.sum(), report)

        return output, loss_func

    model.train()
    result = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter([batch]), model=[model], num_microbatches=1,
        seq_length=S, micro_batch_size=len(LENS), forward_only=False)
    out = {}
    if result:
        total, count = result[0]['loss']
        out['loss'] = float(total / count)
    if per_token:
        for p in model.parameters():
            if p.grad is not None:
                p.grad /= (labels != -100).sum()
    if model.pre_process:
        lm = getattr(model, 'language_model', model)  # a multimodal checkpoint's language model
        out['emb_grad'] = lm.embedding.word_embeddings.weight.grad.clone()
    if all_grads:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
        out['grads'] = {n: t.clone() for n, t in model.config.bridge.export_weights(models)}
    return out


# checkpoint names mcore-bridge exports -> the parameter names transformers 5 renames them to on load: Hunyuan-V3's
# router and shared MLP, MiniMax-M2's block_sparse_moe with experts w1 / w3 / w2 (first match of each pattern, in order)
_CHECKPOINT_RENAMES = ((r'\.mlp\.router\.gate\.weight$', '.mlp.gate.weight'),
                       (r'\.mlp\.shared_mlp\.', '.mlp.shared_experts.'),
                       (r'\.block_sparse_moe\.experts\.(\d+)\.w1\.weight$', r'.mlp.experts.\1.gate_proj.weight'),
                       (r'\.block_sparse_moe\.experts\.(\d+)\.w3\.weight$', r'.mlp.experts.\1.up_proj.weight'),
                       (r'\.block_sparse_moe\.experts\.(\d+)\.w2\.weight$', r'.mlp.experts.\1.down_proj.weight'),
                       (r'\.block_sparse_moe\.', '.mlp.'))


def transformers_names(grads):
    """``grads`` keyed by checkpoint names -> keyed by the transformers model's parameter names (its renames)."""
    import re
    out = {}
    for name, t in grads.items():
        for pattern, repl in _CHECKPOINT_RENAMES:
            name = re.sub(pattern, repl, name)
        out[name] = t
    return out


def fuse_experts(grads):
    """Per-expert checkpoint names (``experts.{e}.gate_proj/up_proj/down_proj.weight``, what mcore-bridge exports)
    -> the fused parameters transformers 5 holds (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj``)."""
    import re
    out, experts = {}, {}
    for name, t in grads.items():
        m = re.fullmatch(r'(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight', name)
        if m:
            experts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = t
        else:
            out[name] = t
    for prefix, parts in experts.items():
        n = 1 + max(e for e, _ in parts)
        out[prefix + '.gate_up_proj'] = torch.stack([torch.cat([parts[e, 'gate_proj'], parts[e, 'up_proj']])
                                                     for e in range(n)])
        out[prefix + '.down_proj'] = torch.stack([parts[e, 'down_proj'] for e in range(n)])
    return out


def fuse_gate_up(grads):
    """mcore-bridge's dense MLP names (``mlp.gate_proj.weight`` / ``mlp.up_proj.weight``, what it exports for every
    family) -> the fused ``mlp.gate_up_proj.weight`` [gate; up] that transformers' GLM-4-0414 holds."""
    out = dict(grads)
    for name in [n for n in grads if n.endswith('.mlp.gate_proj.weight')]:
        prefix = name[:-len('gate_proj.weight')]
        out[prefix + 'gate_up_proj.weight'] = torch.cat([out.pop(name), out.pop(prefix + 'up_proj.weight')])
    return out
