"""Critic touch points: --value_clip_range parsing/validation (swift_plt.critic.arguments, patched
MegatronArguments) and MegatronSft.prepare_trainer patched vs original (critic trainer only for llama3_2_critic;
every other model type gets exactly upstream's trainer)."""
from types import SimpleNamespace

import pytest

from harness.dist import spawn
from swift_plt.critic import CRITIC_MODEL_TYPE
from swift_plt.critic.arguments import resolve_critic_args


def make_args(model_type=CRITIC_MODEL_TYPE, **kw):
    base = dict(model_type=model_type, value_clip_range=None, rlhf_type=None, task_type='causal_lm', packing=False,
                context_parallel_size=1, lazy_tokenize=False, streaming=False, truncation_strategy='delete',
                mtp_num_layers=None, remove_unused_columns=True, strict=False)
    base.update(kw)
    return SimpleNamespace(**base)


def test_other_model_types_untouched():
    args = make_args(model_type='llama', packing=True, truncation_strategy='left')
    before = dict(vars(args))
    resolve_critic_args(args)
    assert vars(args) == before


def test_value_clip_range_needs_the_critic():
    with pytest.raises(ValueError, match='--value_clip_range trains a critic: use --model_type llama3_2_critic'):
        resolve_critic_args(make_args(model_type='llama', value_clip_range=0.2))
    with pytest.raises(ValueError, match='--value_clip_range must be >= 0'):
        resolve_critic_args(make_args(value_clip_range=-0.1))


def test_critic_run_keeps_row_fields_and_is_strict():
    args = make_args(value_clip_range=0.2)
    resolve_critic_args(args)
    assert args.remove_unused_columns is False and args.strict is True
    resolve_critic_args(make_args(packing=True))  # --packing: rows binned, targets packed with their tokens


@pytest.mark.parametrize('kw, message', [
    (dict(lazy_tokenize=True), '--lazy_tokenize/--streaming'),
    (dict(streaming=True), '--lazy_tokenize/--streaming'),
    (dict(truncation_strategy='left'), '--truncation_strategy left'),
    (dict(truncation_strategy='split'), '--truncation_strategy split'),
    (dict(rlhf_type='dpo'), 'rlhf_type=dpo'),
    (dict(task_type='seq_cls'), '--task_type seq_cls'),
    (dict(mtp_num_layers=1), '--mtp_num_layers'),
])
def test_unsupported_combinations_fail_with_what_to_change(kw, message):
    with pytest.raises(ValueError, match=r'--model_type llama3_2_critic cannot be trained with: .*' + message):
        resolve_critic_args(make_args(**kw))


def _parse_and_pick_trainer():
    from transformers import HfArgumentParser

    import swift.megatron.pipelines.train.sft as sft
    from swift.megatron.arguments import MegatronPretrainArguments, MegatronSftArguments
    from swift.megatron.trainers import MegatronTrainer
    from swift.utils.utils import _patch_get_type_hints

    import swift_plt.critic.trainer as critic_trainer
    parsed = {}
    for cls in (MegatronPretrainArguments, MegatronSftArguments):
        with _patch_get_type_hints():
            parser = HfArgumentParser([cls])
        ns, rest = parser.parse_known_args(['--model', 'x', '--value_clip_range', '0.2'])
        default, _ = parser.parse_known_args(['--model', 'x'])
        parsed[cls.__name__] = (ns.value_clip_range, rest, default.value_clip_range)

    class Recorder:  # stands in for the trainer classes: records what prepare_trainer built

        def __init__(self, args, template):
            self.args, self.template = args, template

    picks = {}
    patched = sft.MegatronSft.prepare_trainer
    original = patched.__wrapped__
    saved = sft.MegatronTrainer, sft.MegatronEmbeddingTrainer, sft.MegatronRerankerTrainer
    saved_critic = critic_trainer.MegatronCriticTrainer
    sft.MegatronTrainer = type('MegatronTrainer', (Recorder, ), {})
    sft.MegatronEmbeddingTrainer = type('MegatronEmbeddingTrainer', (Recorder, ), {})
    sft.MegatronRerankerTrainer = type('MegatronRerankerTrainer', (Recorder, ), {})
    critic_trainer.MegatronCriticTrainer = type('MegatronCriticTrainer', (Recorder, ), {})
    try:
        for model_type, task_type in (('llama', 'causal_lm'), ('llama3_2_plt', 'causal_lm'), ('qwen3', 'embedding'),
                                      ('qwen3', 'reranker'), (CRITIC_MODEL_TYPE, 'causal_lm')):
            self = SimpleNamespace(args=SimpleNamespace(model_type=model_type, task_type=task_type), template='tpl')
            got, ref = patched(self), original(self)
            picks[(model_type, task_type)] = (type(got).__name__, type(ref).__name__, got.args is self.args)
    finally:
        sft.MegatronTrainer, sft.MegatronEmbeddingTrainer, sft.MegatronRerankerTrainer = saved
        critic_trainer.MegatronCriticTrainer = saved_critic
    return parsed, picks, issubclass(saved_critic, MegatronTrainer), getattr(patched, '_swift_plt', False)


def test_value_clip_range_parses_and_trainer_choice_patched_vs_original():
    (out, ) = spawn(_parse_and_pick_trainer, 1)
    parsed, picks, is_subclass, marked = out
    assert parsed == {name: (0.2, [], None) for name in ('MegatronPretrainArguments', 'MegatronSftArguments')}
    assert marked and is_subclass
    for (model_type, task_type), (got, ref, same_args) in picks.items():
        assert same_args
        if model_type == CRITIC_MODEL_TYPE:
            assert (got, ref) == ('MegatronCriticTrainer', 'MegatronTrainer')
        else:  # upstream's choice, unchanged
            assert got == ref, (model_type, task_type)
