"""Every upstream touch point of swift-plt, one module per patched upstream module (docs/plugin.md).
Each module defines ``TARGET`` (the upstream module), ``VERIFIED`` (the version its patch was verified against) and
``apply(module)``, run by ``swift_plt.plugin.import_hook`` right after ``TARGET`` is imported: it guards the names it
touches, and its wrappers return upstream's result unchanged unless K > 1 or the model is a critic.
"""
from swift_plt.plugin.patches import (
                                      swift_arguments_base_args,
                                      swift_megatron_arguments,
                                      swift_megatron_pipelines_train_sft,
                                      swift_megatron_trainers_base,
                                      swift_megatron_trainers_utils,
                                      swift_megatron_utils,
                                      swift_megatron_utils_megatron_lm_utils,
                                      swift_model,
                                      swift_pipelines_train_sft,
                                      swift_template,
                                      transformers_trainer,
)

PATCHES = [
    swift_model,  # the plugin's model types registered with ms-swift; a misspelt critic type gets the critic types
    swift_megatron_arguments,  # --patch_size, --value_clip_range on MegatronArguments (+ validation before step 1)
    swift_arguments_base_args,  # --patch_size on every HF-side command, K handed to the model loader
    swift_megatron_utils,  # get_padding_to: batch length multiple of K * upstream multiple
    swift_megatron_trainers_utils,  # get_batch_on_this_pp_rank: no label roll at K>1, first patch masked
    swift_pipelines_train_sft,  # SwiftSft._prepare_template: K to the template; _post_process_datasets: PLT data report
    swift_template,  # Template: pad every document to a multiple of K; critic returns -> token-aligned tensors
    swift_megatron_utils_megatron_lm_utils,  # load_mcore_checkpoint: critic from a causal-LM mcore checkpoint
    swift_megatron_pipelines_train_sft,  # MegatronSft.prepare_trainer: the critic trainer for the critic types
    swift_megatron_trainers_base,  # BaseMegatronTrainer.train_step: at K>1 a step with no loss token fails
    transformers_trainer,  # Trainer.get_batch_samples (HF backend): at K>1 a step with no loss token fails
]
