"""CPU test harness for swift-plt (ms-swift 4.6.0 -> mcore-bridge 1.6.5 -> megatron-core 0.16.1, torch CPU).

Public API
  install()                                   patches that make mcore-bridge / `swift.megatron` run on CPU (patches.py)
  make_tiny_llama(out_dir, ...) -> str        random-init HF Llama + offline BPE tokenizer (swift_plt/tools/tiny.py)
  make_jsonl(path, rows=64, seed=0) -> str    ms-swift pretraining rows (swift_plt/tools/tiny.py)
  init_megatron(rank, world_size, tp, pp)     gloo + megatron parallel state in this process (dist.py)
  init_single_process_megatron(tp=1, pp=1)    the same for a world of one
  destroy_megatron()
  spawn(fn, world_size, *args, tp, pp, cp)    run fn on N gloo ranks (forked from a preloaded server), return results
  cp_attention.enable(mode)                   CPU stand-in for TE's context-parallel attention (also THD), cp_attention.py
  build_mcore_model(hf_dir, ...) -> [model]   mcore-bridge model(s) with HF weights, as ms-swift builds them (model.py)
  mcore_logits(models, input_ids)             full-vocab logits through TP gather / PP schedule
  hf_logits(hf_dir, input_ids)                HF reference logits
  run_cli(argv, env_extra, nproc, timeout)    stock `megatron ...` / `swift ...` CLI in a subprocess on CPU (cli.py)
  CPU_MEGATRON_ARGS                           the flags a CPU `megatron pt/sft` run needs
  parse_losses(output) -> [float]             per-step training losses from ms-swift's log
  parse_logs(output) -> [dict]                every log dict (loss, grad_norm, learning_rate, iteration, ...)

Import it as ``harness`` with ``tests/`` on sys.path (pytest's default rootdir-relative import does that). The
pytest process itself need not call ``install()``: ``spawn`` and ``run_cli`` install it in the processes they start.

In spawned ranks (new processes, so megatron state and the RoPE hazard stay out of the caller)::

    def _worker(hf_dir, input_ids):                 # module level: it is pickled by reference
        from harness import build_mcore_model, hf_logits, mcore_logits
        ref = hf_logits(hf_dir, input_ids)
        return mcore_logits(build_mcore_model(hf_dir, tp=2), input_ids), ref

    results = spawn(_worker, 2, make_tiny_llama(tmp), ids, tp=2)   # one (logits, ref) per rank

The stock CLI::

    proc = run_cli(['megatron', 'pt', '--model', hf_dir, '--model_type', 'llama', '--template', 'llama',
                    '--dataset', make_jsonl(path), '--torch_dtype', 'float32', '--fp16', 'false', '--bf16', 'false',
                    '--train_iters', '3', '--logging_steps', '1', '--output_dir', out, *CPU_MEGATRON_ARGS],
                   nproc=2)                          # NPROC_PER_NODE=2 -> torchrun, 2 gloo ranks
    losses = parse_losses(proc.stdout)

Every upstream patch is listed, with versions, in ``patches.py``.
"""
from .cli import CPU_MEGATRON_ARGS, parse_logs, parse_losses, run_cli
from .dist import destroy_megatron, free_port, init_megatron, init_single_process_megatron, spawn
from .model import build_mcore_model, hf_logits, mcore_logits
from .patches import install, is_installed
from .tiny import make_jsonl, make_tiny_llama

__all__ = [
    'install', 'is_installed', 'make_tiny_llama', 'make_jsonl', 'init_megatron', 'init_single_process_megatron',
    'destroy_megatron', 'spawn', 'free_port', 'build_mcore_model', 'mcore_logits', 'hf_logits', 'run_cli',
    'parse_losses', 'parse_logs', 'CPU_MEGATRON_ARGS'
]
