#!/usr/bin/env python3
"""GPU helper of tests/gpu/critic_model.sh: the llama3_2_critic model through ms-swift + mcore-bridge + TE.

    critic_model.py make-critic --lm DIR --out DIR        HF critic (LlamaForTokenClassification, num_labels=1, bf16)
                                                          = the LM's trunk + a random head N(0, 0.5)
    torchrun --nproc_per_node N critic_model.py mg-values --model DIR --out FILE [--tp 2|--pp 2] [--sp]
                                                          per-token values of the Megatron critic on the fixed batch
                                                          (CPU dry run: SWIFT_PLT_CPU_HARNESS=1 PYTHONPATH=tests/harness/site
                                                          ... --mg-kwargs '{"attention_backend": "unfused",
                                                          "ddp_backend": "gloo", "use_cpu_initialization": true}')
    critic_model.py hf-values --model DIR --out FILE      the same through plain transformers (bf16, cuda)
    critic_model.py compare NAME A B --tol REL            prints `CRITIC NAME ... -> OK|FAIL` (exit 1 on FAIL)

The fixed batch: B=2, S=256 token ids from torch.Generator seed 0 in [4, vocab), positions 0..S-1, causal mask.
HF and Megatron run in separate processes (mcore-bridge's RoPE code breaks later HF Llama construction in-process).
"""
import argparse
import json
import os
import sys

import torch

B, S = 2, 256


def batch(vocab):
    return torch.randint(4, vocab, (B, S), generator=torch.Generator().manual_seed(0))


def make_critic(lm, out):
    from transformers import AutoConfig, LlamaForTokenClassification

    from swift_plt.critic.keys import critic_hf_config
    config = critic_hf_config(AutoConfig.from_pretrained(lm))
    torch.manual_seed(1)
    model = LlamaForTokenClassification.from_pretrained(lm, config=config, dtype=torch.bfloat16)
    torch.nn.init.normal_(model.score.weight, std=0.5)
    model.save_pretrained(out, safe_serialization=True)
    for name in os.listdir(lm):
        if name.startswith('tokenizer') or name in ('special_tokens_map.json', 'generation_config.json'):
            with open(os.path.join(lm, name), 'rb') as f, open(os.path.join(out, name), 'wb') as g:
                g.write(f.read())
    print(f'critic: {out} score {list(model.score.weight.shape)} bias={model.score.bias is not None}')


def hf_values(model_dir, out):
    from transformers import AutoModelForTokenClassification
    model, info = AutoModelForTokenClassification.from_pretrained(model_dir, dtype=torch.bfloat16,
                                                                  output_loading_info=True)
    model = model.cuda().eval()
    with torch.no_grad():
        values = model(input_ids=batch(model.config.vocab_size).cuda()).logits.float().cpu()
    info = {k: sorted(v) if isinstance(v, (set, list)) else str(v) for k, v in info.items()}
    torch.save({'values': values, 'class': type(model).__name__, 'loading_info': info,
                'bias': model.score.bias is not None}, out)
    print(f'hf-values: {type(model).__name__} values {list(values.shape)} loading_info={info}')


def mg_values(model_dir, out, tp, pp, sp, mg_kwargs=None):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from swift.megatron.arguments import MegatronArguments
    from swift.megatron.model import get_mcore_model
    from swift.model import get_processor

    from swift_plt.critic.model import values as values_of
    from swift_plt.plugin.register import register_all
    register_all()
    torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', 0)))
    kw = dict(
        model=model_dir, model_type='llama3_2_critic', torch_dtype=torch.bfloat16, bf16=True, fp16=False,
        attention_backend='fused', padding_free=False, recompute_granularity='none', seed=42, micro_batch_size=B,
        global_batch_size=B * int(os.environ.get('WORLD_SIZE', 1)) // (tp * pp), finetune=True, no_save_optim=True,
        no_save_rng=True, no_load_optim=True, no_load_rng=True, tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp, sequence_parallel=sp)
    kw.update(mg_kwargs or {})
    args = MegatronArguments(**kw)
    hf_config = get_processor(model_dir, model_type='llama3_2_critic').model_info.config
    models = get_mcore_model(args, hf_config)
    models[0].config.bridge.load_weights(models, model_dir)
    for m in models:
        m.cuda().eval()
    model = models[0]
    ids = batch(hf_config.vocab_size).cuda()
    pos = torch.arange(S, device='cuda').unsqueeze(0).expand(B, S)

    def step(it, m):
        next(it)
        return m(input_ids=ids, position_ids=pos, attention_mask=None), None

    with torch.no_grad():
        if pp == 1:
            out_t, _ = step(iter([None]), model)
        else:
            res = get_forward_backward_func()(forward_step_func=step, data_iterator=iter([None]), model=models,
                                              num_microbatches=1, seq_length=S, micro_batch_size=B, forward_only=True)
            out_t = res[0] if ps.is_pipeline_last_stage() and res else None
    info = {'rank': dist.get_rank(), 'post_process': model.post_process, 'type': type(model).__name__,
            'task_type': model.config.task_type, 'untied': not model.share_embeddings_and_output_weights}
    if model.post_process:
        w = model.value_head.weight
        info.update(head_shape=list(w.shape), head_dtype=str(w.dtype), head_sp_attr=getattr(w, 'sequence_parallel', None),
                    out_shape=list(out_t.shape), out_dtype=str(out_t.dtype))
        gathered = [torch.empty_like(w) for _ in range(ps.get_tensor_model_parallel_world_size())]
        dist.all_gather(gathered, w.data.contiguous(), group=ps.get_tensor_model_parallel_group())
        info['head_equal_across_tp'] = all(torch.equal(g, gathered[0]) for g in gathered)
        assert torch.equal(values_of(out_t), out_t[:, :-1, 0])
    infos = [None] * dist.get_world_size()
    dist.all_gather_object(infos, info)
    if out_t is not None and ps.get_tensor_model_parallel_rank() == 0:
        torch.save({'values': out_t.float().cpu(), 'ranks': infos}, out)
        print(f'mg-values: tp={tp} pp={pp} sp={sp} ranks={json.dumps(infos)}')
    dist.barrier()
    dist.destroy_process_group()


def compare(name, a, b, tol):
    ra, rb = torch.load(a, weights_only=False), torch.load(b, weights_only=False)
    va, vb = ra['values'], rb['values']
    if va.shape != vb.shape:
        print(f'CRITIC {name}: shapes {list(va.shape)} vs {list(vb.shape)} -> FAIL')
        return 1
    d = (va - vb).abs().max().item()
    rel = d / vb.abs().max().item()
    ok = rel <= tol
    extra = ''
    if 'ranks' in ra:  # Megatron: which ranks own the head, its attributes, replicated under TP
        owners = [r for r in ra['ranks'] if r['post_process']]
        extra += (f' head_owner_ranks={[r["rank"] for r in owners]} of {len(ra["ranks"])}'
                  f' head={owners[0]["head_shape"]} out={owners[0]["out_shape"]} {owners[0]["out_dtype"]}'
                  f' head_sp_attr={[r["head_sp_attr"] for r in owners]}'
                  f' head_equal_across_tp={all(r["head_equal_across_tp"] for r in owners)}')
    if 'class' in ra:  # transformers
        extra += f' class={ra["class"]} bias={ra["bias"]} loading_info={json.dumps(ra["loading_info"])}'
    print(f'CRITIC {name}: values {list(va.shape)} max|d|={d:.3g} rel={rel:.3g} (tol {tol}) '
          f'max|v|={vb.abs().max().item():.3g}{extra} -> {"OK" if ok else "FAIL"}')
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest='cmd', required=True)
    p = sub.add_parser('make-critic')
    p.add_argument('--lm', required=True)
    p.add_argument('--out', required=True)
    p = sub.add_parser('hf-values')
    p.add_argument('--model', required=True)
    p.add_argument('--out', required=True)
    p = sub.add_parser('mg-values')
    p.add_argument('--model', required=True)
    p.add_argument('--out', required=True)
    p.add_argument('--tp', type=int, default=1)
    p.add_argument('--pp', type=int, default=1)
    p.add_argument('--sp', action='store_true')
    p.add_argument('--mg-kwargs', default=None, help='JSON dict of extra MegatronArguments fields (CPU harness)')
    p = sub.add_parser('compare')
    p.add_argument('name')
    p.add_argument('a')
    p.add_argument('b')
    p.add_argument('--tol', type=float, required=True)
    a = ap.parse_args()
    if a.cmd == 'make-critic':
        make_critic(a.lm, a.out)
    elif a.cmd == 'hf-values':
        hf_values(a.model, a.out)
    elif a.cmd == 'mg-values':
        mg_values(a.model, a.out, a.tp, a.pp, a.sp, json.loads(a.mg_kwargs) if a.mg_kwargs else None)
    else:
        return compare(a.name, a.a, a.b, a.tol)
    return 0


if __name__ == '__main__':
    sys.exit(main())
