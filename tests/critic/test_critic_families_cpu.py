"""The critic on other decoder families (swift_plt.critic.families), for real on CPU (tests/harness), fp32: trunk keys
are the family's own checkpoint keys; qwen3 (dense, QK-norm) and qwen3_moe (MoE) critics load from a critic dir (head
bit-exact, values = transformers' <Family>ForTokenClassification) and from a causal LM (head zeros + warning), export
bit for bit to a dir plain transformers loads with the same values, and refuse another family's checkpoint; ms-swift's
HF side; the converters on a qwen3 / qwen3_moe trunk; one `megatron sft` run of qwen3_critic."""
import json
import math
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.dist import spawn
from swift_plt.compat.transformers import critic_head_has_bias, hf_rope_guard
from swift_plt.critic.families import CRITIC_FAMILIES, critic_for, family_refusal
from swift_plt.tools.tiny_families import make_tiny_family, unavailable

pytestmark = pytest.mark.xdist_group('critic_families_cpu')

B, S, VOCAB, H = 2, 12, 512, 64
# the Megatron-side families tested here: dense, MoE, hybrid Gated DeltaNet, multimodal hybrid
FAMILIES = ['qwen3', 'qwen3_moe', 'qwen3_next', 'qwen3_5']
CLS = {'llama': 'Llama', 'qwen2': 'Qwen2', 'qwen3': 'Qwen3', 'qwen3_moe': 'Qwen3Moe', 'qwen2_moe': 'Qwen2Moe',
       'deepseek_v3': 'DeepseekV3', 'qwen3_next': 'Qwen3Next', 'qwen3_5': 'Qwen3_5'}
OTHER = {'qwen3': 'qwen3_moe'}  # the other family's checkpoint each critic is shown (default: qwen3)
ALL = [f.hf_model_type for f in CRITIC_FAMILIES.values()]


def make_family_critic(out_dir, lm_dir, seed=1, head_std=0.5):
    """A critic in our HF format: the causal LM's trunk, the family's ForTokenClassification, head ~ N(0, head_std)."""
    from swift_plt.tools.tiny import make_tiny_critic
    return make_tiny_critic(out_dir, lm_dir, seed=seed, head_std=head_std)


@pytest.fixture(scope='module')
def family_dirs(tmp_path_factory):
    dirs = {}

    def get(family, critic=False):
        if unavailable(family):  # Qwen3.5 on transformers 4.57 (no Qwen3_5Config there)
            pytest.skip(unavailable(family))
        if family not in dirs:
            root = tmp_path_factory.mktemp(family)
            lm = make_tiny_family(family, str(root / 'lm'), vocab_size=VOCAB)
            dirs[family] = (lm, make_family_critic(str(root / 'critic'), lm))
        return dirs[family][int(critic)]

    return get


@pytest.fixture(scope='module')
def input_ids():
    return torch.randint(4, VOCAB, (B, S), generator=torch.Generator().manual_seed(0))


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def _safetensors_shapes(d):
    return {k: tuple(v.shape) for k, v in load_file(os.path.join(d, 'model.safetensors')).items()}


# ------------------------------------------------------------------------------------------------ keys and table
@pytest.mark.parametrize('family', ALL)
def test_trunk_keys_are_the_family_checkpoint_keys(family, family_dirs):
    """The trunk the critic expects is what the family's checkpoints store (per-expert MoE keys on disk, also on
    transformers 5.x, which fuses experts in memory); a critic dir is recognised as a critic, the LM as a causal LM."""
    from transformers import AutoConfig

    from swift_plt.critic.keys import check_critic_keys, critic_hf_config, trunk_shapes
    lm, critic = family_dirs(family), family_dirs(family, critic=True)
    config = AutoConfig.from_pretrained(lm)
    shapes = _safetensors_shapes(lm)
    assert trunk_shapes(config) == {k: v for k, v in shapes.items() if k != 'lm_head.weight'}
    assert check_critic_keys(shapes, config) == 'missing'
    assert check_critic_keys(_safetensors_shapes(critic), config) == 'loaded'
    saved = json.load(open(os.path.join(critic, 'config.json')))
    cls = CLS[family] + 'ForTokenClassification'
    assert critic_hf_config(config).architectures == saved['architectures'] == [cls]
    assert saved['id2label'] == {'0': 'LABEL_0'} and saved['tie_word_embeddings'] is False


def test_mtp_layer_keys_ignored_like_transformers(family_dirs):
    """DeepSeek-V3 and Qwen3-Next checkpoints carry a multi-token-prediction layer (model.layers.61.*, mtp.*) that
    transformers ignores."""
    from transformers import AutoConfig

    from swift_plt.critic.keys import check_critic_keys
    lm = family_dirs('deepseek_v3')
    shapes = {**_safetensors_shapes(lm), 'model.layers.61.eh_proj.weight': (H, 2 * H)}
    assert check_critic_keys(shapes, AutoConfig.from_pretrained(lm)) == 'missing'
    # Qwen3-Next checkpoints carry theirs as mtp.* (Qwen3NextForTokenClassification ignores ^mtp.* as the LM does)
    lm = family_dirs('qwen3_next')
    shapes = {**_safetensors_shapes(lm), 'mtp.fc.weight': (H, 2 * H), 'mtp.layers.0.mlp.gate.weight': (4, H)}
    assert check_critic_keys(shapes, AutoConfig.from_pretrained(lm)) == 'missing'


def test_table_and_refusals():
    from types import SimpleNamespace

    from swift_plt.critic.arguments import is_critic
    from swift_plt.critic.keys import token_classification_class
    from swift_plt.plugin.arguments import plt_model_refusal
    assert set(CRITIC_FAMILIES) == {'llama3_2_critic', 'qwen2_critic', 'qwen2_moe_critic', 'qwen3_critic',
                                    'qwen3_moe_critic', 'deepseek_v3_critic', 'qwen3_next_critic', 'qwen3_5_critic'}
    from swift_plt.critic.families import unknown_critic_refusal
    assert 'transformers has no Qwen3_5MoeForTokenClassification' in unknown_critic_refusal('qwen3_5_moe_critic')
    assert 'did you mean qwen3_next_critic' in unknown_critic_refusal('qwen3_next_critc')
    assert all(is_critic(SimpleNamespace(model_type=t)) for t in CRITIC_FAMILIES)
    assert not is_critic(SimpleNamespace(model_type='qwen3'))
    assert plt_model_refusal(SimpleNamespace(model_type='qwen3_moe_critic')) == (
        '`qwen3_moe_critic` is a critic (value head), trained token by token. Use --patch_size 1.')
    assert all(critic_for(f.hf_model_type) == t for t, f in CRITIC_FAMILIES.items())
    assert family_refusal('qwen3_critic', 'qwen3') is None
    assert family_refusal('llama3_2_critic', 'mistral') is None  # as before: any Llama-like checkpoint
    assert 'use --model_type qwen3_moe_critic' in family_refusal('qwen3_critic', 'qwen3_moe')
    assert 'use --model_type llama3_2_critic' in family_refusal('qwen3_critic', 'llama')
    assert 'use --model_type qwen3_critic' in family_refusal('llama3_2_critic', 'qwen3')
    assert 'critics exist for: llama (llama3_2_critic), qwen2 (qwen2_critic)' in family_refusal('qwen3_critic',
                                                                                              'mistral')
    with pytest.raises(ValueError, match=r'model type `internlm3` \(config.json\) has no \*ForTokenClassification in '
                       r'transformers .*; critics exist for: llama \(llama3_2_critic\)'):
        token_classification_class('internlm3')


# ------------------------------------------------------------------------------------------------ Megatron side
def _capture_warnings(module):
    warnings = []
    orig = module.logger.warning
    module.logger.warning = lambda msg, *a, **k: (warnings.append(str(msg)), orig(msg, *a, **k))
    return warnings, lambda: setattr(module.logger, 'warning', orig)


def _family_run(critic_type, lm, critic, other_lm, input_ids, head, out_dir):
    """In a spawned rank: the critic from the critic dir (sentinel head replaced by the loaded one) and its export;
    from the causal LM (head zeros + warning; then with ``head`` set); another family's checkpoint refused."""
    from harness.model import build_mcore_model, mcore_logits
    from swift_plt.critic import model as critic_model
    from swift_plt.plugin.register import register_critic_mcore
    assert register_critic_mcore()
    out = {}
    for name, d in (('critic', critic), ('lm', lm)):
        models = build_mcore_model(d, mcore_model_type=critic_type, load_weights=False)
        model = models[0]
        model.value_head.weight.data.fill_(7.0)
        warnings, restore = _capture_warnings(critic_model)
        try:
            model.config.bridge.load_weights(models, d)
        finally:
            restore()
        lm_model = getattr(model, 'language_model', model)  # a multimodal checkpoint's (Qwen3.5) language model
        out[name] = {'out': mcore_logits(models, input_ids), 'head': model.value_head.weight.detach().clone(),
                     'warnings': warnings, 'task_type': model.config.task_type,
                     'untied': not lm_model.share_embeddings_and_output_weights,
                     'moe': type(getattr(lm_model.decoder.layers[-1].mlp, 'experts', None)).__name__,
                     'model': (type(model).__name__, type(model.config.model_meta.loader(model.config)).__name__,
                               type(model.config.bridge).__name__)}
        if name == 'critic':
            model.config.bridge.save_weights(models, out_dir)
            model.config.hf_config.save_pretrained(out_dir)
        else:
            model.value_head.weight.data.copy_(head)
            out[name]['out_with_head'] = mcore_logits(models, input_ids)
    try:
        build_mcore_model(other_lm, mcore_model_type=critic_type, load_weights=False)
        out['other'] = 'built'
    except ValueError as e:
        out['other'] = str(e)
    return out


def _hf_critic_values(critic_dir, input_ids):
    from transformers import AutoModelForTokenClassification
    with hf_rope_guard():
        model, info = AutoModelForTokenClassification.from_pretrained(critic_dir, dtype=torch.float32,
                                                                      output_loading_info=True)
    assert not any(info.values()), info  # no missing / unexpected / mismatched key
    assert (model.score.bias is not None) is critic_head_has_bias()
    with torch.no_grad():
        return type(model).__name__, model.eval()(input_ids=input_ids).logits, model.score.weight.detach().clone()


def _trunk_values(lm_dir, head, input_ids):
    """Brute force: the causal LM's final hidden states (plain transformers) times the head."""
    from transformers import AutoModel
    with hf_rope_guard():
        trunk = AutoModel.from_pretrained(lm_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return trunk(input_ids=input_ids).last_hidden_state @ head.T


@pytest.mark.parametrize('family', FAMILIES)
def test_megatron_critic_matches_hf_and_round_trips(family, family_dirs, input_ids, tmp_path):
    critic_type = critic_for(family)
    lm, critic = family_dirs(family), family_dirs(family, critic=True)
    other_family = OTHER.get(family, 'qwen3')
    other = family_dirs(other_family)
    head = torch.randn(1, H, generator=torch.Generator().manual_seed(5))
    out_dir = str(tmp_path / 'export')
    (r, ) = spawn(_family_run, 1, critic_type, lm, critic, other, input_ids, head, out_dir)
    cls_name, ref, ref_head = _hf_critic_values(critic, input_ids)
    assert cls_name == CLS[family] + 'ForTokenClassification'
    got = r['critic']
    assert got['task_type'] == 'seq_cls' and got['untied'] and not got['warnings']
    assert got['moe'] == ('NoneType' if family in ('qwen3', 'qwen3_5') else 'TEGroupedMLP'), got['moe']
    assert got['model'] == {'qwen3_next': ('CriticGPTModel', 'CriticQwen3NextLoader', 'CriticQwen3NextGDNBridge'),
                            'qwen3_5': ('CriticMultimodalGPTModel', 'CriticQwen3NextLoader', 'CriticQwen3_5Bridge')
                            }.get(family, ('CriticGPTModel', 'CriticModelLoader', 'CriticBridge')), got['model']
    assert torch.equal(got['head'], ref_head)  # loaded bit-exact: the 7.0 sentinel is gone
    assert got['out'].shape == (B, S, 1) and _rel(got['out'], ref) <= 1e-5, _rel(got['out'], ref)
    print(f'{family}: critic values max rel |mcore - HF| = {_rel(got["out"], ref):.3g}, '
          f'max abs {float((got["out"] - ref).abs().max()):.3g} (|HF| max {float(ref.abs().max()):.3g})')
    # export: every tensor bit for bit, and plain transformers gives the Megatron values
    src, exported = load_file(os.path.join(critic, 'model.safetensors')), load_file(os.path.join(out_dir,
                                                                                                 'model.safetensors'))
    assert set(exported) == set(src) and all(torch.equal(exported[k], src[k]) for k in src)
    cls_exported, values, _ = _hf_critic_values(out_dir, input_ids)
    assert cls_exported == cls_name and _rel(values, got['out']) <= 1e-5
    # from the causal LM: head zeros with the warning; the trunk is loaded (values = hidden @ head once set)
    from_lm = r['lm']
    assert torch.equal(from_lm['head'], torch.zeros(1, H)) and torch.equal(from_lm['out'], torch.zeros(B, S, 1))
    assert len(from_lm['warnings']) == 1
    assert f'{critic_type}: {lm} has no value head (score.weight): initialised the value head with zeros' in \
        from_lm['warnings'][0]
    ref_lm = _trunk_values(lm, head, input_ids)
    assert _rel(from_lm['out_with_head'], ref_lm) <= 1e-5, _rel(from_lm['out_with_head'], ref_lm)
    other_type = critic_for(other_family)
    assert f'--model_type {critic_type} is for `{family}` checkpoints' in r['other'] and \
        f'use --model_type {other_type}' in r['other'], r['other']


# ------------------------------------------------------------------------------------------------ HF side (ms-swift)
def _hf_side(critic_type, lm, critic, other_lm):
    from swift.model import get_model_processor

    from swift_plt.plugin.register import register_critic_swift
    register_critic_swift()
    out = {}
    for name, d in (('lm', lm), ('critic', critic)):
        model, _ = get_model_processor(d, model_type=critic_type, torch_dtype=torch.float32)
        ids = torch.tensor([[5, 6, 7]])
        out[name] = (type(model).__name__, model.score.weight.detach().clone(), model.config.num_labels,
                     tuple(model(input_ids=ids, labels=ids).logits.shape))
    try:
        get_model_processor(other_lm, model_type=critic_type, torch_dtype=torch.float32)
        out['other'] = 'loaded'
    except ValueError as e:
        out['other'] = str(e)
    return out


def test_hf_side_loader_qwen3_moe(family_dirs):
    """ms-swift's HF side of qwen3_moe_critic: Qwen3MoeForTokenClassification(num_labels=1), head zeros from a causal
    LM and loaded from a critic; token-id labels ignored; a qwen3 (dense) checkpoint refused with the right type."""
    lm, critic, other = family_dirs('qwen3_moe'), family_dirs('qwen3_moe', critic=True), family_dirs('qwen3')
    (out, ) = spawn(_hf_side, 1, 'qwen3_moe_critic', lm, critic, other)
    ref = load_file(os.path.join(critic, 'model.safetensors'))['score.weight']
    assert out['lm'][0] == out['critic'][0] == 'Qwen3MoeForTokenClassification'
    assert torch.equal(out['lm'][1], torch.zeros(1, H)) and torch.equal(out['critic'][1], ref)
    assert out['lm'][2:] == out['critic'][2:] == (1, (1, 3, 1))
    assert 'use --model_type qwen3_critic' in out['other'], out['other']


# ------------------------------------------------------------------------------------------------ converters
def _source(fmt, sd, head):
    trunk = {k: v for k, v in sd.items() if k != 'lm_head.weight'}
    if fmt == 'trl':
        return {**sd, 'v_head.summary.weight': head, 'v_head.summary.bias': torch.zeros(1)}
    if fmt == 'openrlhf':
        return {**trunk, 'value_head.weight': head}
    return {**trunk, 'lm_head.weight': head}


@pytest.mark.parametrize('family, fmt', [('qwen3', 'trl'), ('qwen3', 'openrlhf'), ('qwen3', 'verl'),
                                         ('qwen3_moe', 'verl'), ('qwen3_next', 'trl')])
def test_converters_on_family_trunk(family, fmt, family_dirs, input_ids, tmp_path):
    """TRL / OpenRLHF / verl critics on a qwen3 (qwen3_moe) trunk -> the family's ForTokenClassification: every
    trunk tensor unchanged, the head moved, plain transformers loads it with the brute-force trunk . head values."""
    from swift_plt.critic.convert import main
    lm = family_dirs(family)
    sd = load_file(os.path.join(lm, 'model.safetensors'))
    head = torch.randn(1, H, generator=torch.Generator().manual_seed(1))
    src = tmp_path / 'src'
    src.mkdir()
    save_file(_source(fmt, sd, head), str(src / 'model.safetensors'))
    shutil.copy(os.path.join(lm, 'config.json'), src / 'config.json')
    assert main(['--from', fmt, str(src), str(tmp_path / 'out')]) == 0
    got = load_file(str(tmp_path / 'out' / 'model.safetensors'))
    trunk = {k: v for k, v in sd.items() if k != 'lm_head.weight'}
    bias = {'score.bias'} if critic_head_has_bias() else set()
    assert set(got) == set(trunk) | {'score.weight'} | bias
    assert all(torch.equal(got[k], v) for k, v in trunk.items()) and torch.equal(got['score.weight'], head)
    cls_name, values, _ = _hf_critic_values(str(tmp_path / 'out'), input_ids)
    assert cls_name == CLS[family] + 'ForTokenClassification'
    ref = _trunk_values(lm, head, input_ids)
    assert _rel(values, ref) <= 1e-6, _rel(values, ref)


# ------------------------------------------------------------------------------------------------ CLI
@pytest.mark.slow
def test_megatron_sft_qwen3_critic(family_dirs, tmp_path):
    """`megatron sft --model_type qwen3_critic` from a qwen3 causal LM, without --custom_register_path (the plugin
    registers the critic types): the head starts at zero, the value loss is finite and falls."""
    from harness.cli import CPU_MEGATRON_ARGS, parse_logs, run_cli
    from harness.critic_rows import write_critic_jsonl
    data = write_critic_jsonl(tmp_path / 'reward.jsonl')
    argv = ['megatron', 'sft', '--model', family_dirs('qwen3'), '--model_type', 'qwen3_critic', '--template', 'chatml',
            '--dataset', str(data), '--max_length', '128', '--train_iters', '4',
            '--micro_batch_size', '4', '--global_batch_size', '8', '--lr', '5e-3', '--lr_warmup_iters', '0',
            '--lr_decay_style', 'constant', '--logging_steps', '1', '--seed', '7', '--torch_dtype', 'float32',
            '--fp16', 'false', '--bf16', 'false', '--save_steps', '1000', '--no_save_optim', 'true',
            '--no_save_rng', 'true', '--save_safetensors', 'false', '--dataset_num_proc', '1',
            '--dataloader_num_workers', '0', '--output_dir', str(tmp_path / 'out'), *CPU_MEGATRON_ARGS]
    proc = run_cli(argv, timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:]
    logs = parse_logs(proc.stdout)
    assert len(logs) == 4, proc.stdout[-3000:]
    losses = [d['value_loss'] for d in logs]
    print('qwen3_critic value_loss', losses)
    assert 'qwen3_critic' in proc.stdout and 'initialised the value head with zeros' in proc.stdout
    assert logs[0]['value_mean'] == 0.0 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]


@pytest.mark.slow
@pytest.mark.parametrize('family', ['qwen3_next', 'qwen3_5'])
def test_swift_export_hybrid_critic_round_trip(family, family_dirs, input_ids, tmp_path):
    """The stock `swift export` on the hybrid families' critics (bf16, as tests/critic/test_critic_cli_cpu.py for
    Llama: a float32 export runs megatron in fp16): the HF critic dir --to_mcore (qwen3_next: with ms-swift's
    --test_convert_precision, HF side = CriticHFLoader; Qwen3.5's precision test encodes an image it downloads, so
    not here), then --to_hf from the distributed checkpoint alone: every tensor bit for bit (Qwen3.5: the vision
    tower included), and plain transformers loads it (<Family>ForTokenClassification) with the source's values."""
    import re

    from harness.cli import run_cli
    from test_critic_cli_cpu import _bf16_copy
    critic_type = critic_for(family)
    critic = _bf16_copy(family_dirs(family, critic=True), str(tmp_path / 'critic'))

    def export(*args):
        proc = run_cli(['swift', 'export', '--model_type', critic_type, '--torch_dtype', 'bfloat16', *args],
                       timeout=900)
        assert proc.returncode == 0, proc.stdout[-5000:]
        return proc.stdout

    precision = ['--test_convert_precision', 'true'] if family == 'qwen3_next' else []
    out = export('--model', critic, '--to_mcore', 'true', *precision, '--output_dir', str(tmp_path / 'mcore'))
    if precision:
        mean_diff = float(re.search(r'mean_diff \(with loss\): ([0-9.e-]+)', out).group(1))
        print(f'{critic_type} swift export --test_convert_precision (bf16) mean_diff {mean_diff:.3g}')
        assert mean_diff < 1e-2, mean_diff  # per-token values (|v| up to ~8), HF vs mcore, bf16 weights (0.00096)
    assert 'no value head' not in out
    export('--mcore_model', str(tmp_path / 'mcore'), '--to_hf', 'true', '--output_dir', str(tmp_path / 'hf'))
    ref, got = load_file(os.path.join(critic, 'model.safetensors')), load_file(str(tmp_path / 'hf' /
                                                                                  'model.safetensors'))
    assert set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
    assert any(k.startswith('model.visual.') for k in got) is (family == 'qwen3_5')
    cls = CLS[family] + 'ForTokenClassification'
    config = json.load(open(tmp_path / 'hf' / 'config.json'))
    assert config['architectures'] == [cls] and config['id2label'] == {'0': 'LABEL_0'}
    cls_name, values, _ = _hf_critic_values(str(tmp_path / 'hf'), input_ids)
    _, ref_values, _ = _hf_critic_values(critic, input_ids)
    assert cls_name == cls and torch.equal(values, ref_values)


@pytest.mark.parametrize('family', ['qwen3', 'qwen3_5'])
def test_template_builds_a_critics_dummy_model_by_its_type(family, family_dirs, monkeypatch):
    """A multimodal template (Qwen3.5's rope index) builds a meta-device model of the run's checkpoint. Upstream
    matches the dir's architectures, which the plugin's types do not match (Qwen3_5ForTokenClassification: none, so
    'no suitable model_type' in the collator); the template names the critic's type instead. Others: upstream's way."""
    from types import SimpleNamespace

    import swift.model.model_meta as model_meta
    import swift_plt.plugin.patches.swift_template as patch
    from swift.template.base import Template
    critic = family_dirs(family, critic=True)
    if family == 'qwen3_5':
        assert model_meta.get_matched_model_types(['Qwen3_5ForTokenClassification']) == []  # why it is needed
        try:
            import qwen_vl_utils  # noqa: F401  (ms-swift's Qwen3.5 processor needs it)
        except ImportError:
            pytest.skip('qwen_vl_utils is not installed (Qwen3.5\'s processor)')
    info = SimpleNamespace(model_dir=critic, model_type=critic_for(family))
    model = patch.plugin_dummy_model(info)
    assert type(model).__name__ == CLS[family] + 'ForTokenClassification' and model.device.type == 'meta'
    assert patch.plugin_dummy_model(SimpleNamespace(model_dir=critic, model_type=family)) is None
    monkeypatch.setattr(patch, 'plugin_dummy_model', lambda i: ('built for', i.model_type))
    tpl = SimpleNamespace(model=None, dummy_model=None, model_info=info)
    assert Template._get_model(tpl) == ('built for', critic_for(family)) == tpl.dummy_model
