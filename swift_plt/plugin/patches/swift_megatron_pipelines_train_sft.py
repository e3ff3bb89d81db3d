"""ms-swift ``MegatronSft.prepare_trainer`` (``megatron sft``/``pt``): the critic trainer
(``swift_plt.critic.trainer.MegatronCriticTrainer``) for a critic type (``llama3_2_critic``, ``qwen3_critic``, ...); upstream's trainer otherwise.
In a recipe stage 2 started beside stage 1 (``swift_plt.recipe.early_start``) it first waits for stage 1 to finish:
the data are ready then, the model not yet built."""
import functools

from swift_plt.compat.guard import guard
from swift_plt.compat.supported import VERIFIED_STACKS
from swift_plt.compat.versions import check_once

TARGET = 'swift.megatron.pipelines.train.sft'
VERIFIED = f'ms-swift 4.6.0 on {VERIFIED_STACKS}'


def apply(module):
    check_once()
    cls = module.MegatronSft
    upstream = guard(cls, 'prepare_trainer', ['self'], VERIFIED)
    if getattr(upstream, '_swift_plt', False):
        return
    from swift_plt.critic.arguments import is_critic
    from swift_plt.recipe.early_start import wait_for_gate

    @functools.wraps(upstream)
    def prepare_trainer(self):
        wait_for_gate()
        if is_critic(self.args):
            from swift_plt.critic.trainer import MegatronCriticTrainer
            return MegatronCriticTrainer(self.args, self.template)
        return upstream(self)

    prepare_trainer._swift_plt = True
    cls.prepare_trainer = prepare_trainer
